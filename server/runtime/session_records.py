"""The records a session hands out (its cursors, an overdue turn, a barge-in: frozen) and its
input cursors."""

from __future__ import annotations

from dataclasses import dataclass

from server.runtime.events import ItemTruncated
from server.runtime.turn import TurnState


@dataclass(frozen=True)
class Cursors:
    """The four cursors, in samples at 48 kHz on the session media clock."""

    heard_until: int
    prefilled_until: int
    generation_cursor: int
    playback_cursor: int


@dataclass(frozen=True)
class Overdue:
    """A turn state past its deadline by ``waited_ms`` (ms): ``stage`` is what it was waiting
    for (``speech``: the user's own turn; ``asr``, ``llm``, ``tts``: an engine; ``playback``:
    the reply playing)."""

    state: TurnState
    stage: str
    waited_ms: float


@dataclass(frozen=True)
class BargeIn:
    """What a bump did: the epochs, discarded chunks, the chunk cut mid-play (if any) and the
    queued output flushed (samples at 48 kHz)."""

    old_epoch: int
    new_epoch: int
    reason: str
    discarded: tuple[int, ...]
    truncated: ItemTruncated | None
    flushed_samples: int


class InputCursors:
    """The input side's cursors (samples at 48 kHz): ``heard_until`` and ``prefilled_until``
    only grow, and what was pushed into the model was heard."""

    def __init__(self) -> None:
        self.heard_until = 0
        self.prefilled_until = 0

    def advance_heard(self, samples: int) -> None:
        """``samples`` more input has been received."""
        if samples < 0:
            raise ValueError("heard_until only grows")
        self.heard_until += samples

    def advance_prefilled(self, until: int) -> None:
        """Input up to ``until`` has been pushed into the model."""
        if until < self.prefilled_until or until > self.heard_until:
            raise ValueError(
                f"prefilled_until must stay within [{self.prefilled_until}, {self.heard_until}],"
                f" got {until}"
            )
        self.prefilled_until = until
