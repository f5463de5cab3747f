"""The model ladder: which of the language models the server can use this machine affords.

The ladder is an ordered list of models, smallest first (``pipeline.llm_ladder``). At start
the largest one is loaded and timed beside the other engines; where the reply it predicts
(the end of the user's speech to the first reply audio at the client) meets
``pipeline.latency_budget_ms``, it is the pick. Otherwise the next smaller one is loaded and
timed, and so on. A model that fails to load (its packages not installed, a broken file) is
passed over. Where none meets the budget, the smallest that loaded is the pick: the fastest
there is, and the log says that the budget is not met.

:class:`Climb` decides, I/O-free: it says which rung to try next and takes each trial's
outcome; the start-up (server/__main__.py) loads and times what it says.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class RungOutcome(Enum):
    """What trying one rung gave."""

    FAILED = "failed"  # it did not load (its packages missing, a broken file)
    TOO_SLOW = "too slow"  # its predicted reply misses the budget
    FITS = "fits"  # its predicted reply meets the budget


@dataclass(frozen=True)
class RungTrial:
    """One rung tried: its predicted reply at the client (ms) and the sessions the calibration
    admits with it, or why it failed."""

    name: str
    outcome: RungOutcome
    predicted_ms: float | None = None
    capacity: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "outcome": self.outcome.value}
        if self.predicted_ms is not None:  # None where it gave no reply (JSON has no inf)
            finite = math.isfinite(self.predicted_ms)
            out["predicted_ms"] = round(self.predicted_ms, 1) if finite else None
        if self.capacity is not None:
            out["capacity"] = self.capacity
        if self.error is not None:
            out["error"] = self.error
        return out

    def describe(self) -> str:
        if self.outcome is RungOutcome.FAILED:
            return f"{self.name}: failed ({self.error})"
        assert self.predicted_ms is not None
        if not math.isfinite(self.predicted_ms):
            return f"{self.name}: no reply in its warm-up"
        return f"{self.name}: {self.predicted_ms:.0f} ms predicted, capacity {self.capacity}"


@dataclass(frozen=True)
class LadderChoice:
    """The model picked, why, and every rung tried on the way (largest first)."""

    model: str
    reason: str
    budget_ms: float
    trials: tuple[RungTrial, ...]
    explicit: bool = False  # named (pipeline.llm_model, a remote model): not climbed

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "reason": self.reason,
            "budget_ms": self.budget_ms,
            "explicit": self.explicit,
            "trials": [t.to_dict() for t in self.trials],
        }


class NoRungLoaded(Exception):
    """Not one model of the ladder loaded."""


class Climb:
    """The ladder climbed down from its top: which rung to try next, and the pick.

    ``rungs``: model names, smallest first. ``budget_ms``: the longest predicted reply at the
    client that fits. Call :meth:`next_rung`, try it, report with :meth:`failed` or
    :meth:`measured`, until :meth:`next_rung` gives None; then :meth:`choice`.
    """

    def __init__(self, rungs: Sequence[str], budget_ms: float, explicit: bool = False) -> None:
        if not rungs:
            raise ValueError("a ladder needs at least one rung")
        if len(set(rungs)) != len(rungs):
            raise ValueError(f"a ladder names each model once: {list(rungs)}")
        if budget_ms <= 0:
            raise ValueError(f"budget_ms must be positive, got {budget_ms}")
        self._left = list(reversed(rungs))  # largest first
        self._budget_ms = budget_ms
        self._explicit = explicit
        self._trials: list[RungTrial] = []
        self._loaded: str | None = None  # the rung that loaded last (the smallest so far)
        self._trying: str | None = None

    @property
    def budget_ms(self) -> float:
        return self._budget_ms

    @property
    def trials(self) -> tuple[RungTrial, ...]:
        return tuple(self._trials)

    @property
    def pending(self) -> str | None:
        """The rung loaded and not yet measured (None: none)."""
        return self._trying if self._trying is not None and self._trying == self._loaded else None

    def next_rung(self) -> str | None:
        """The rung to load next (the largest not yet tried); None once the pick is made."""
        assert self._trying is None, f"{self._trying} was not reported"
        if self._fits() is not None or not self._left:
            return None
        self._trying = self._left.pop(0)
        return self._trying

    def loaded(self, name: str) -> None:
        """``name`` loaded (its timing follows with :meth:`measured` or :meth:`failed`)."""
        assert name == self._trying, f"{name} loaded while {self._trying} was tried"
        self._loaded = name

    def failed(self, name: str, error: str) -> None:
        """``name`` did not load: the engine keeps the rung it held, the next smaller one is
        tried. (A warm-up that fails is no failure here: the calibration predicts from the
        reference machine's figures then, and says so.)"""
        assert self._loaded != name, f"{name} loaded, then was reported as failed"
        self._report(RungTrial(name, RungOutcome.FAILED, error=error))

    def measured(self, name: str, predicted_ms: float, capacity: int) -> None:
        """``name`` predicts a reply in ``predicted_ms`` at the client and admits ``capacity``
        sessions."""
        assert self._loaded == name, f"{name} was measured without being loaded"
        fits = predicted_ms <= self._budget_ms and capacity >= 1
        outcome = RungOutcome.FITS if fits else RungOutcome.TOO_SLOW
        self._report(RungTrial(name, outcome, predicted_ms, capacity))

    def _report(self, trial: RungTrial) -> None:
        assert trial.name == self._trying, f"{trial.name} reported while {self._trying} was tried"
        self._trying = None
        self._trials.append(trial)
        log.info("model ladder: %s", trial.describe())

    def _fits(self) -> RungTrial | None:
        return next((t for t in self._trials if t.outcome is RungOutcome.FITS), None)

    def choice(self) -> LadderChoice:
        """The pick: the largest rung that fits; where none does, the smallest that loaded
        (the one loaded now). :class:`NoRungLoaded` where none loaded."""
        over = self._fits() is not None or not self._left
        assert self._trying is None and over, "the climb is not over"
        budget = f"{self._budget_ms:.0f} ms"
        fits = self._fits()
        if fits is not None:
            assert fits.predicted_ms is not None
            if self._explicit:
                why = f"named ({fits.predicted_ms:.0f} ms predicted, within the budget of {budget})"
            elif fits is self._trials[0]:
                why = f"the largest; {fits.predicted_ms:.0f} ms predicted, within {budget}"
            else:
                why = (
                    f"the largest that meets the budget of {budget}"
                    f" ({fits.predicted_ms:.0f} ms predicted)"
                )
            return LadderChoice(fits.name, why, self._budget_ms, self.trials, self._explicit)
        timed = [t for t in self._trials if t.outcome is RungOutcome.TOO_SLOW]
        if not timed:
            errors = "; ".join(t.describe() for t in self._trials)
            raise NoRungLoaded(f"no language model loaded: {errors}")
        last = timed[-1]  # the smallest that loaded: the one the engine holds now
        assert last.name == self._loaded and last.predicted_ms is not None
        said = (
            f"{last.predicted_ms:.0f} ms predicted"
            if math.isfinite(last.predicted_ms)
            else "no reply in its warm-up"
        )
        if self._explicit:
            why = f"named; {said}, which misses the budget of {budget}"
        else:
            why = f"none meets the budget of {budget}: the smallest that loaded ({said})"
        return LadderChoice(last.name, why, self._budget_ms, self.trials, self._explicit)


async def load_next(climb: Climb, load: Callable[[str], Awaitable[T]]) -> T | None:
    """The next rung of ``climb`` that loads (``load(name)``); rungs that fail to load are
    reported as failed and passed over. None once the climb is over."""
    while (name := climb.next_rung()) is not None:
        log.info("model ladder: loading %s", name)
        try:
            engine = await load(name)
        except Exception as exc:  # a missing package, a broken file: the next rung is tried
            climb.failed(name, f"{type(exc).__name__}: {exc}")
            continue
        climb.loaded(name)
        return engine
    return None
