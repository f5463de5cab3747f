"""The event loop's lag monitor: a fake clock for the logic, one real blocked loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from server.clock import FakeClock
from server.looplag import LoopLagMonitor


async def test_reports_how_late_each_wake_up_was() -> None:
    clock = FakeClock()
    late = iter([0.0, 3.0, 120.0])
    seen: list[float] = []

    async def sleep(seconds: float) -> None:  # the loop wakes the sleeper late by the next value
        clock.advance(seconds * 1000 + next(late))

    await LoopLagMonitor(seen.append, clock, interval_ms=50, sleep=sleep).run(ticks=3)
    assert seen == [0.0, 3.0, 120.0]


async def test_early_wake_up_is_no_lag() -> None:
    clock = FakeClock()
    seen: list[float] = []

    async def sleep(seconds: float) -> None:
        clock.advance(seconds * 1000 - 1)

    await LoopLagMonitor(seen.append, clock, sleep=sleep).run(ticks=2)
    assert seen == [0.0, 0.0]


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_ms"):
        LoopLagMonitor(lambda ms: None, FakeClock(), interval_ms=0)


async def test_a_blocked_loop_shows_up() -> None:
    from server.clock import MonotonicClock

    seen: list[float] = []
    monitor = asyncio.create_task(LoopLagMonitor(seen.append, MonotonicClock(), 10).run())
    await asyncio.sleep(0.03)
    time.sleep(0.2)  # a CPU-heavy call on the loop, the mistake the monitor is for
    await asyncio.sleep(0.03)
    monitor.cancel()
    await asyncio.gather(monitor, return_exceptions=True)
    assert max(seen) >= 150
