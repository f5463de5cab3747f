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
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

ENGINE_NICE = 5  # CFS gives a nice-5 thread about a third of a nice-0 one's share
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
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
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
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        if not lower_this_thread(nice):
            log.debug("%s: this platform keeps one priority for all threads", name)
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        return await done
    finally:
        await asyncio.to_thread(thread.join)
