"""How much slower this machine is than the one the tests' time bounds were written on.

Machines differ a lot: Whisper tiny.en takes ~0.5 s a call on the 2-core AVX-512 machines the
bounds were written on, and 1.1-1.8 s on a 2-core AVX2-only one. So the suite measures once, at
start, how long Whisper takes on a fixed clip (espeak-ng speech), and every bound on waiting for
work the machine does is multiplied by ``factor()`` (at least 1):

- pytest-timeout's limit of every test (tests/conftest.py);
- the waits of the shared helpers: ``ServerProcess.start``/``wait_health``, the browser tests'
  ``wait_for``, ``Peer.connect``/``wait_event`` (tests/support/peers.py);
- other waits call ``within(seconds)`` themselves.

The shared helpers also follow the load while they wait (``Patience``): of each moment
waited, only the share in which the machine had a CPU free counts (Linux's CPU pressure,
``/proc/pressure/cpu``), so other jobs that start mid-test stretch the wait, up to 4x.

What a test asserts never changes with the factor; only how long it waits for it to happen.
``TEST_PACE=<factor>`` skips the measurement (the suite sets it for the processes it starts, so
they all use the same factor).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable

REFERENCE_WHISPER_S = 0.5  # median Whisper call on the clip below, where the bounds were written
CLIP = "What is the capital of France, and how many people live there?"  # ~3.6 s of speech
MAX_FACTOR = 20.0
ENV = "TEST_PACE"


def whisper_seconds() -> float:
    """Median time (s) of one Whisper tiny.en call on the clip, after a warm-up call."""
    from models.asr import WhisperAsr
    from server.pipeline.resample import resample
    from tests.support.speech import speak

    asr = WhisperAsr(window="full")  # the window the reference was measured with
    clip = resample(speak(CLIP), 48_000, 16_000)
    asr.transcribe(clip)  # first call: allocations, caches
    times = []
    for _ in range(3):
        started = time.perf_counter()
        asr.transcribe(clip)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@functools.cache
def _pace() -> tuple[float, str]:
    """The factor (>= 1) and how it was found; measured once per process unless ``TEST_PACE``
    gives it."""
    given = os.environ.get(ENV)
    if given:
        value, how = float(given), f"given: {ENV}={given}"
    else:
        seconds = whisper_seconds()
        value = seconds / REFERENCE_WHISPER_S
        how = (
            f"Whisper tiny.en {seconds:.2f} s a call on the reference clip,"
            f" against {REFERENCE_WHISPER_S} s"
        )
        os.environ[ENV] = f"{value:.2f}"  # servers and helpers the tests start use the same
    return min(MAX_FACTOR, max(1.0, value)), how


def factor() -> float:
    """The slowness of this machine against the reference (>= 1)."""
    return _pace()[0]


def describe() -> str:
    """How the factor was found, for the run's output."""
    return _pace()[1]


def whisper_call_s() -> float:
    """Seconds one Whisper tiny.en call on a few seconds of speech takes on this machine."""
    return REFERENCE_WHISPER_S * factor()


def within(seconds: float) -> float:
    """A bound of ``seconds`` on the reference machine, stretched to this one."""
    return seconds * factor()


PSI_CPU = "/proc/pressure/cpu"
MAX_PRESSURE = 0.75  # a wait counts at least a quarter of its time: at most 4x as long


def cpu_pressure(path: str = PSI_CPU) -> float:
    """The share (0-1) of the last 10 s in which runnable tasks waited for a CPU (Linux PSI,
    ``some avg10``), at most MAX_PRESSURE; where the kernel has no PSI, the load average over
    the cores (the share of runnable tasks beyond them)."""
    try:
        with open(path) as f:
            some = f.readline().split()
        share = float(some[1].split("=")[1]) / 100
    except (OSError, IndexError, ValueError):
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        share = max(0.0, 1.0 - cores / load) if load > 0 else 0.0
    return min(MAX_PRESSURE, max(0.0, share))


class Patience:
    """A wait of ``seconds`` on the reference machine that follows the load while it waits:
    the pace measured at start stretches it (``within``), and of each moment waited only the
    share the machine had a CPU free counts (``cpu_pressure``, measured as it goes), so a wait
    that other jobs slow down waits longer, up to 1 / (1 - MAX_PRESSURE) times as long."""

    def __init__(
        self,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
        pressure: Callable[[], float] = cpu_pressure,
    ) -> None:
        self.budget_s = within(seconds)
        self._clock = clock
        self._pressure = pressure
        self._last = clock()
        self.counted_s = 0.0  # waited, less the time the machine had no CPU free
        self.waited_s = 0.0  # waited on the clock

    def left(self) -> float:
        """Seconds still to wait, as the load so far counts them (0: the wait is over)."""
        now = self._clock()
        step, self._last = now - self._last, now
        self.waited_s += step
        self.counted_s += step * (1.0 - self._pressure())
        return max(0.0, self.budget_s - self.counted_s)

    def describe(self) -> str:
        """How long it waited, for a failure message."""
        return f"{self.waited_s:.1f} s ({self.budget_s:.1f} s counted after the load)"
