"""Shared test helpers: a fake clock, small runtime configs, tones of known length, and the
client side of loopback calls (ICE pinned to 127.0.0.1, client peers closed after the test)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from server.client import ClientPeer
from server.clock import FakeClock
from server.config import RuntimeConfig
from server.media import ms_to_samples
from server.playback import PCM
from server.rtc import pin_host_addresses
from server.session import Session


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
async def peers(client_ice: None) -> AsyncIterator[list[ClientPeer]]:
    """Client peers a test opens; closed when it ends."""
    opened: list[ClientPeer] = []
    yield opened
    for peer in opened:
        await peer.close()
