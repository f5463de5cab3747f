"""How much slower this machine is than the one the tests' time bounds were written on.

Machines differ a lot: Whisper tiny.en takes ~0.5 s a call on the 2-core AVX-512 machines the
bounds were written on, and 1.1-1.8 s on a 2-core AVX2-only one. So the suite measures once, at
start, how long Whisper takes on a fixed clip (espeak-ng speech), and every bound on waiting for
work the machine does is multiplied by ``factor()`` (at least 1):

- pytest-timeout's limit of every test (tests/conftest.py);
- the waits of the shared helpers: ``ServerProcess.start``/``wait_health``, the browser tests'
  ``wait_for``, ``Peer.connect``/``wait_event`` (tests/support/peers.py);
- other waits call ``within(seconds)`` themselves.

What a test asserts never changes with the factor; only how long it waits for it to happen.
``TEST_PACE=<factor>`` skips the measurement (the suite sets it for the processes it starts, so
they all use the same factor).
"""

from __future__ import annotations

import functools
import os
import statistics
import time

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
