"""OpenMP's wait policy for the engines that load an OpenMP runtime into this process.

Whisper's CTranslate2 carries its own libgomp, and the llama.cpp wheel (``xllamacpp``) is built
with the system's (its ``OPENMP = 1``: llama.cpp's own ``poll`` setting then does nothing).
libgomp's threads spin on a core for about 300,000 rounds whenever they wait (at every barrier,
and after each piece of work) before they sleep. Here the cores are shared: the recogniser,
the LLM, the voice, the video and the event loop run on the same two, and a spinning thread
holds a core another engine needs. ``OMP_WAIT_POLICY=PASSIVE`` puts them to sleep at once.

libgomp reads the variable once, when it loads, so it must be set before the engine's first
import; it is unset again after, so that processes started later (vLLM's engine core) keep
their own default. An operator who set ``OMP_WAIT_POLICY`` keeps their choice.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

WAIT_POLICY = "OMP_WAIT_POLICY"


@contextmanager
def passive_waits() -> Iterator[None]:
    """OpenMP runtimes that load inside put their threads to sleep when they wait."""
    if WAIT_POLICY in os.environ:
        yield
        return
    os.environ[WAIT_POLICY] = "PASSIVE"
    try:
        yield
    finally:
        os.environ.pop(WAIT_POLICY, None)
