"""The server's threads carry their Python names where the OS shows them (top -H, /proc)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from server.clock import FakeClock
from server.config import Config
from server.osthreads import COMM_BYTES, ThreadNamer, keep_naming, name_this_thread
from server.priority import in_lowered_thread
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.scheduling.engine_queue import EngineQueue, JobTag
from server.scheduling.scheduler import make_scheduler

LINUX = Path("/proc/self/task").is_dir()


def os_name() -> str:
    """The calling thread's name as the OS shows it."""
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


def _os_name_of_a_thread_made_here() -> str:
    """The OS name a thread (a C++ worker an engine starts) begins with when made here."""
    seen: list[str] = []
    child = threading.Thread(target=lambda: seen.append(os_name()), name="not-yet-named")
    child.start()
    child.join()
    return seen[0]


@pytest.mark.skipif(not LINUX, reason="no /proc here")
def test_an_engine_loading_thread_names_itself_and_what_it_starts_takes_the_name() -> None:
    async def main() -> tuple[str, str]:
        return await in_lowered_thread(
            lambda: (os_name(), _os_name_of_a_thread_made_here()), 0, "llm-load"
        )

    loading, made = asyncio.run(main())
    assert loading == "llm-load_0"
    assert made == "llm-load_0"  # llama.cpp's threads show as the LLM's


@pytest.mark.skipif(not LINUX, reason="no /proc here")
def test_an_engine_queue_runs_its_jobs_in_a_thread_named_after_the_engine() -> None:
    tag = JobTag("s1", 0, lambda: SessionView("s1", 0, 0.0, 1000.0))

    async def main() -> str:
        queue = EngineQueue("tts", make_scheduler(Config().scheduler), FakeClock())
        return await queue.run(tag, Stage.TTS, 10.0, os_name)

    assert asyncio.run(main()) == "tts_0"


@pytest.mark.skipif(not LINUX, reason="no /proc here")
def test_the_main_thread_keeps_the_process_name() -> None:
    before = os_name()
    assert threading.current_thread() is threading.main_thread()
    assert name_this_thread() is False
    assert os_name() == before


def test_the_namer_writes_each_new_thread_once_and_cuts_long_names(tmp_path: Path) -> None:
    release = threading.Event()
    started = threading.Event()

    def wait() -> None:
        started.set()
        release.wait(10)

    worker = threading.Thread(target=wait, name="a-rather-long-thread-name")
    worker.start()
    started.wait(10)
    try:
        assert worker.native_id is not None
        task = tmp_path / str(worker.native_id)
        task.mkdir()
        namer = ThreadNamer(tmp_path)
        first = namer.name_new()
        written = (task / "comm").read_bytes()
        (task / "comm").write_bytes(b"changed")
        second = namer.name_new()
    finally:
        release.set()
        worker.join()
    assert first == 1  # only the worker: the other threads have no folder here, main is skipped
    assert written == b"a-rather-long-thread-name"[:COMM_BYTES]
    assert second == 0 and (task / "comm").read_bytes() == b"changed"  # not written again


def test_naming_goes_on_every_interval_until_cancelled() -> None:
    calls: list[int] = []
    slept: list[float] = []

    class Counting(ThreadNamer):
        def name_new(self) -> int:
            calls.append(1)
            return 0

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(keep_naming(Counting(), every_s=2.5, sleep=sleep))
    assert len(calls) == 3 and slept == [2.5, 2.5, 2.5]
