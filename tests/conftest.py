"""Shared test helpers: a fake clock, small runtime configs, tones of known length, and the
client side of loopback calls (ICE pinned to 127.0.0.1, client peers closed after the test).

Every test's time limit (pytest-timeout: its marker, else the ini default) is stretched by the
slowness the suite measures at start (tests/support/pace.py); the run's output starts with
which CPU this is and how slow."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from server.clock import FakeClock
from server.config import RuntimeConfig
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from server.runtime.media import ms_to_samples
from server.runtime.playback import PCM
from server.runtime.session import Session
from tests.support import pace
from tests.support.peers import Peer


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stretch every test's time limit by the measured pace (waits on work grow with it)."""
    if not items:
        return
    factor = pace.factor()
    print(f"\nmachine: {this_machine().describe()}\npace: x{factor:.2f} ({pace.describe()})")
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        base = default
        if marker is not None:
            base = float(marker.args[0] if marker.args else marker.kwargs.get("timeout", default))
        if base > 0:
            item.add_marker(pytest.mark.timeout(base * factor), append=False)


def tone(ms: float, amplitude: int = 8000, hz: float = 220.0) -> PCM:
    """A sine tone of ``ms`` milliseconds at 48 kHz, int16 (never exactly zero inside)."""
    n = ms_to_samples(ms)
    t = np.arange(n) / 48_000
    pcm = (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)
    pcm[pcm == 0] = 1
    return pcm


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000.0)


@pytest.fixture
def runtime_config() -> RuntimeConfig:
    return RuntimeConfig(lookahead_budget_ms=2000, fade_ms=5.0)


@pytest.fixture
def session(clock: FakeClock, runtime_config: RuntimeConfig) -> Session:
    return Session("s" * 32, runtime_config, clock)


@pytest.fixture
def client_ice() -> None:
    """Client peers of this process offer 127.0.0.1 as their host candidate (aioice skips it)."""
    pin_host_addresses(["127.0.0.1"])


@pytest.fixture
async def peers(client_ice: None) -> AsyncIterator[list[Peer]]:
    """Client peers a test opens; closed when it ends."""
    opened: list[Peer] = []
    yield opened
    for peer in opened:
        await peer.close()
