"""The shared engine queue runs jobs in the scheduler's order on one worker thread."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from server.clock import FakeClock
from server.config import SchedulerConfig
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.scheduling.engine_queue import EngineQueue, JobTag, ShedWork, StaleWork
from server.scheduling.scheduler import DeadlineScheduler


class Views:
    """Mutable per-session views, as the live sessions would report them."""

    def __init__(self) -> None:
        self.views: dict[str, SessionView] = {}

    def set(self, sid: str, slack: float, epoch: int = 0) -> None:
        self.views[sid] = SessionView(sid, epoch, slack, budget_ms=2000.0)

    def tag(self, sid: str, epoch: int = 0) -> JobTag:
        return JobTag(sid, epoch, lambda: self.views[sid])


@pytest.fixture
def queue() -> EngineQueue:
    return EngineQueue("test", DeadlineScheduler(SchedulerConfig()), FakeClock())


async def blocked(queue: EngineQueue, views: Views) -> tuple[threading.Event, asyncio.Task[str]]:
    """Occupy the worker with a job that runs until the returned event is set."""
    gate, started = threading.Event(), threading.Event()

    def hold() -> str:
        started.set()
        gate.wait(5)
        return "x"

    views.set("blocker", 0)
    task = asyncio.create_task(queue.run(views.tag("blocker"), Stage.TTS, 1, hold))
    for _ in range(1000):  # bounded: the worker takes it at once
        if started.is_set():
            break
        await asyncio.sleep(0.001)
    assert started.is_set()
    return gate, task


async def test_least_slack_runs_first(queue: EngineQueue) -> None:
    views = Views()
    gate, first = await blocked(queue, views)
    order: list[str] = []
    views.set("relaxed", 1500)
    views.set("urgent", 100)

    def record(sid: str) -> None:
        order.append(sid)

    jobs = [
        asyncio.create_task(queue.run(views.tag(s), Stage.TTS, 10, functools.partial(record, s)))
        for s in ("relaxed", "urgent")
    ]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *jobs)
    assert order == ["urgent", "relaxed"]
    await queue.close()


async def test_stale_job_is_dropped_not_run(queue: EngineQueue) -> None:
    views = Views()
    gate, first = await blocked(queue, views)
    ran: list[str] = []
    views.set("s", 0, epoch=0)
    job = asyncio.create_task(queue.run(views.tag("s", 0), Stage.TTS, 10, lambda: ran.append("s")))
    await asyncio.sleep(0)
    views.set("s", 0, epoch=1)  # barge-in while the job waited
    gate.set()
    with pytest.raises(StaleWork):
        await job
    await first
    assert ran == [] and queue.dropped_stale == 1
    await queue.close()


async def test_cancelled_caller_job_never_runs(queue: EngineQueue) -> None:
    views = Views()
    gate, first = await blocked(queue, views)
    ran: list[str] = []
    views.set("s", 0)
    job = asyncio.create_task(queue.run(views.tag("s"), Stage.TTS, 10, lambda: ran.append("s")))
    await asyncio.sleep(0)
    job.cancel()
    gate.set()
    await first
    await asyncio.gather(job, return_exceptions=True)
    assert ran == []
    await queue.close()


async def test_session_over_budget_waits_until_it_drains(queue: EngineQueue) -> None:
    views = Views()
    views.set("full", 2500)  # past its 2000 ms budget
    job = asyncio.create_task(queue.run(views.tag("full"), Stage.TTS, 10, lambda: "done"))
    for _ in range(5):
        await asyncio.sleep(0.005)
    assert not job.done()
    views.set("full", 1000)  # playback drained
    assert await asyncio.wait_for(job, 2) == "done"
    await queue.close()


async def test_jobs_that_start_past_their_deadline_are_reported() -> None:
    clock = FakeClock(10_000.0)
    queue = EngineQueue("tts", DeadlineScheduler(SchedulerConfig()), clock)
    seen: list[tuple[float, bool]] = []
    queue.on_wait = lambda wait_ms, late: seen.append((wait_ms, late))
    playing = SessionView("playing", 0, 1500.0, budget_ms=2000.0)  # 1.5 s buffered: on time
    waited = SessionView("waited", 0, 0.0, budget_ms=2000.0, waiting_since_ms=9_000.0)
    for view in (playing, waited):  # the reply's turn ended 1 s ago: past the 500 ms target
        tag = JobTag(view.session_id, 0, functools.partial(lambda v: v, view))
        assert await queue.run(tag, Stage.TTS, 100, lambda: "ok") == "ok"
    assert seen == [(0.0, False), (0.0, True)]
    assert queue.missed == 1
    await queue.close()


async def test_forget_drops_the_sessions_scheduling_record() -> None:
    scheduler = DeadlineScheduler(SchedulerConfig())
    queue = EngineQueue("tts", scheduler, FakeClock())
    views = Views()
    for sid in ("gone", "live"):
        views.set(sid, 500)
        assert await queue.run(views.tag(sid), Stage.TTS, 10, lambda: "ok") == "ok"
    assert set(scheduler.served) == {"gone", "live"}
    queue.forget("gone")
    assert set(scheduler.served) == {"live"}
    await queue.close()


async def test_optional_job_is_shed_for_required_work(queue: EngineQueue) -> None:
    views = Views()
    gate, first = await blocked(queue, views)
    ran: list[str] = []
    views.set("a", 0)
    views.set("b", 1500)
    partial = asyncio.create_task(
        queue.run(views.tag("a"), Stage.ASR, 90, lambda: ran.append("partial"), optional=True)
    )
    final = asyncio.create_task(
        queue.run(views.tag("b"), Stage.ASR, 90, lambda: ran.append("final"))
    )
    await asyncio.sleep(0)
    assert queue.required_waiting == 1 and queue.waiting == 2
    gate.set()
    with pytest.raises(ShedWork):
        await partial
    await asyncio.gather(first, final)
    assert ran == ["final"] and queue.shed == 1
    await queue.close()
