"""The server's threads by name, as the operating system shows them (``top -H``, ``ps -L``).

Python 3.11 names its threads only for itself: the kernel sees every one as ``python``, so a
profile of the process by thread (``/proc/<pid>/task/<tid>``) cannot tell the LLM's thread
from the speech synthesiser's. Here each Python thread's OS name (its ``comm``, 15 bytes at
most) is set to its Python name: ``tts_0``, ``asr_0``, ``asyncio_3``. A native thread an engine
starts (llama.cpp's, onnxruntime's) takes the name of the thread that started it, so the
threads that load the engines name themselves first (``llm-load_0`` and the threads it made).
The main thread keeps the process's name: ``ps`` and ``pgrep`` show the process by it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

NAME_EVERY_S = 1.0  # how often new threads are named
COMM_BYTES = 15  # the kernel keeps this much of a thread's name (TASK_COMM_LEN - 1)
TASKS = Path("/proc/self/task")


def name_this_thread() -> bool:
    """Give the calling thread its Python name as its OS name; False where that cannot be
    done (not Linux). The main thread is left as it is."""
    thread = threading.current_thread()
    if thread is threading.main_thread():
        return False
    return _write(thread.native_id, thread.name)


class ThreadNamer:
    """Names every Python thread of this process that it has not named yet (threads of a pool
    start when work first comes): call ``name_new()`` now and then."""

    def __init__(self, tasks: Path = TASKS) -> None:
        self._tasks = tasks
        self._named: set[int] = set()

    def name_new(self) -> int:
        """Name the threads started since the last call; returns how many were named."""
        named = 0
        alive: set[int] = set()
        for thread in threading.enumerate():
            tid = thread.native_id
            if tid is None or thread is threading.main_thread():
                continue
            alive.add(tid)
            if tid not in self._named and _write(tid, thread.name, self._tasks):
                named += 1
            self._named.add(tid)
        self._named &= alive  # a thread id is reused once its thread has ended
        return named


def _write(tid: int | None, name: str, tasks: Path = TASKS) -> bool:
    if tid is None:
        return False
    try:
        (tasks / str(tid) / "comm").write_bytes(name.encode()[:COMM_BYTES])
    except OSError:
        return False
    return True


async def keep_naming(
    namer: ThreadNamer,
    every_s: float = NAME_EVERY_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Name new threads every ``every_s`` until cancelled (a few microseconds a call: the
    threads are only listed, and only new ones written)."""
    while True:
        namer.name_new()
        await sleep(every_s)
