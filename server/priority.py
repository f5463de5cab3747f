"""Thread priorities: the media path first, the engines' computing after it.

On Linux every thread has its own nice value, and a thread starts with its creator's. The
event loop paces outbound audio and video every 20-40 ms; an engine's threads (the speech
recogniser's, the LLM's, the speech synthesiser's) compute for hundreds of ms. When both want a
core, the loop should get it first, or a frame leaves late. So the engines are loaded in a
thread of lower priority (``ENGINE_NICE``), and the threads they create (a C++ worker, an
OpenMP team) start with it, and the worker threads that call them lower themselves too. The
loop and the media workers (encoding, rendering) keep the process's priority.

An unprivileged process may lower a thread's priority, never raise it again: a thread lowered
stays lowered, hence threads of their own for it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from server.osthreads import name_this_thread

T = TypeVar("T")

ENGINE_NICE = 5  # CFS gives a nice-5 thread about a third of a nice-0 one's share
LOWEST_PRIORITY = 19  # nice value of background warm-ups: live sessions always go first
GIL_SWITCH_MS = 1.0  # the longest a thread waits for the GIL while another runs Python code


def share_the_gil(switch_ms: float = GIL_SWITCH_MS) -> None:
    """A thread running Python code keeps the GIL until another has waited ``switch_ms`` for
    it (5 ms by Python's default): the loop would wait that long behind a rendering or
    encoding thread each time it wakes. Set once, at start."""
    sys.setswitchinterval(switch_ms / 1000)


def lower_this_thread(nice: int) -> bool:
    """Lower the calling thread's priority by ``nice`` (0: leave it); False where that cannot
    be done (not Linux, or not permitted)."""
    if nice < 0:
        raise ValueError(f"nice must be >= 0, got {nice}")
    if nice == 0:
        return True
    current = thread_nice()
    return current is not None and _set_this_thread(current + nice)


def engine_thread(nice: int) -> None:
    """A pool's initializer for an engine's thread: its OS name is its Python name (the
    threads it starts take it), and its priority is ``nice`` lower."""
    name_this_thread()
    lower_this_thread(nice)


def lowest_priority() -> bool:
    """Make the calling thread the last to get a core (``LOWEST_PRIORITY``). Returns False
    where that cannot be done."""
    return _set_this_thread(LOWEST_PRIORITY)


def _set_this_thread(nice: int) -> bool:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):
        return False
    return True


def thread_nice() -> int | None:
    """The calling thread's nice value (None where threads have none of their own)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return None


async def in_lowered_thread(fn: Callable[[], T], nice: int, name: str) -> T:
    """``fn()`` in a thread of its own whose priority is first lowered by ``nice``: what it
    creates (threads, thread pools) starts lowered too. The loop waits without blocking."""
    pool = ThreadPoolExecutor(
        1, thread_name_prefix=name, initializer=engine_thread, initargs=(nice,)
    )
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)
    finally:
        await asyncio.to_thread(pool.shutdown)  # joins its thread, off the loop
