"""How late the event loop runs what is due: the lag of a timer that should fire every 50 ms.

Anything that holds the loop (a CPU-heavy call, a long synchronous step) delays every
coroutine: outbound audio frames leave late, inbound frames queue up. The monitor sleeps for an
interval, and reports how much later than due it woke (ms) to ``observe`` (the
``avatar_event_loop_lag_seconds`` histogram).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from server.clock import Clock

INTERVAL_MS = 50.0


class LoopLagMonitor:
    """Runs until cancelled; ``sleep`` is injected so tests can drive it with a fake clock."""

    def __init__(
        self,
        observe: Callable[[float], None],
        clock: Clock,
        interval_ms: float = INTERVAL_MS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if interval_ms <= 0:
            raise ValueError(f"interval_ms must be > 0, got {interval_ms}")
        self._observe = observe
        self._clock = clock
        self._interval_ms = interval_ms
        self._sleep = sleep

    async def run(self, ticks: int | None = None) -> None:
        """Measure every interval, ``ticks`` times (None: until cancelled)."""
        done = 0
        while ticks is None or done < ticks:
            due = self._clock.now_ms() + self._interval_ms
            await self._sleep(self._interval_ms / 1000)
            self._observe(max(0.0, self._clock.now_ms() - due))
            done += 1
