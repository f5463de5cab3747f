"""Injected time: the runtime never reads the wall clock directly."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic clock in milliseconds (float; only differences matter)."""

    def now_ms(self) -> float:
        """Current monotonic time in ms."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic_ns`` in ms."""

    def now_ms(self) -> float:
        return time.monotonic_ns() / 1_000_000


class FakeClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> float:
        return self._now_ms

    def advance(self, ms: float) -> None:
        """Move time forward by ``ms`` milliseconds (never backwards)."""
        if ms < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {ms} ms)")
        self._now_ms += ms
