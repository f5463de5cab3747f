"""Thread priorities: the engines' threads run below the event loop, and what they create too."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from server.clock import FakeClock
from server.config import Config, load_config
from server.errors import ConfigError
from server.pipeline.cpuplan import plan_cpus
from server.priority import in_lowered_thread, lower_this_thread, share_the_gil, thread_nice
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.scheduling.engine_queue import EngineQueue, JobTag
from server.scheduling.scheduler import make_scheduler

pytestmark = pytest.mark.skipif(
    not hasattr(os, "setpriority") or thread_nice() is None,
    reason="threads have no priority of their own here",
)


def _nice_of_a_thread_made_here() -> int | None:
    """The nice value a thread created by the calling thread starts with (a C++ worker or an
    OpenMP team an engine makes as it loads is such a thread)."""
    seen: list[int | None] = []
    child = threading.Thread(target=lambda: seen.append(thread_nice()))
    child.start()
    child.join()
    return seen[0]


def test_a_lowered_thread_and_the_threads_it_makes_run_below_the_loop() -> None:
    async def main() -> tuple[int | None, int | None, int | None]:
        before = thread_nice()
        inside = await in_lowered_thread(
            lambda: (thread_nice(), _nice_of_a_thread_made_here()), 3, "test-load"
        )
        return before, *inside

    loop_nice, load_nice, child_nice = asyncio.run(main())
    assert loop_nice is not None
    assert load_nice == loop_nice + 3
    assert child_nice == loop_nice + 3  # the engine's own threads start where it loaded
    assert thread_nice() == loop_nice  # the caller keeps its priority


def test_a_lowered_thread_hands_its_error_to_the_caller() -> None:
    def broken() -> None:
        raise FileNotFoundError("no model here")

    async def main() -> None:
        await in_lowered_thread(broken, 2, "test-load")

    with pytest.raises(FileNotFoundError, match="no model here"):
        asyncio.run(main())


def test_nice_zero_leaves_the_thread_and_a_negative_one_is_refused() -> None:
    def probe() -> tuple[bool, int | None]:
        return lower_this_thread(0), thread_nice()

    result: list[tuple[bool, int | None]] = []
    worker = threading.Thread(target=lambda: result.append(probe()))
    worker.start()
    worker.join()
    assert result == [(True, thread_nice())]
    with pytest.raises(ValueError, match="nice must be >= 0"):
        lower_this_thread(-1)


def test_an_engine_queue_runs_its_jobs_below_the_loop() -> None:
    config = Config().scheduler
    tag = JobTag("s1", 0, lambda: SessionView("s1", 0, 0.0, 1000.0))

    async def main() -> tuple[int | None, int | None, int | None]:
        lowered = EngineQueue("asr", make_scheduler(config), FakeClock(), nice=4)
        plain = EngineQueue("tts", make_scheduler(config), FakeClock())
        low = await lowered.run(tag, Stage.ASR, 10.0, thread_nice)
        same = await plain.run(tag, Stage.TTS, 10.0, thread_nice)
        return thread_nice(), low, same

    loop_nice, low, same = asyncio.run(main())
    assert loop_nice is not None
    assert low == loop_nice + 4
    assert same == loop_nice


def test_the_plan_carries_the_engines_priority_and_the_setting_is_bounded() -> None:
    plan = plan_cpus({0, 1}, engine_nice=7)
    assert plan.engine_nice == 7
    assert "engines at nice +7" in plan.describe()
    assert plan.to_dict()["engine_nice"] == 7
    assert plan_cpus({0, 1}).engine_nice == Config().pipeline.engine_nice == 5
    with pytest.raises(ConfigError, match="engine_nice"):
        load_config(env={"AVATAR_PIPELINE_ENGINE_NICE": "20"})
    assert load_config(env={"AVATAR_PIPELINE_ENGINE_NICE": "0"}).pipeline.engine_nice == 0


def test_a_thread_waits_for_the_gil_at_most_a_millisecond_behind_another() -> None:
    before = sys.getswitchinterval()
    try:
        share_the_gil()
        assert sys.getswitchinterval() == pytest.approx(0.001)
    finally:
        sys.setswitchinterval(before)
