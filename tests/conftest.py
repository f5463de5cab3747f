"""Shared test helpers: a fake clock, small runtime configs, tones of known length."""

from __future__ import annotations

import numpy as np
import pytest

from server.clock import FakeClock
from server.config import RuntimeConfig
from server.media import ms_to_samples
from server.playback import PCM
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
