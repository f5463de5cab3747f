"""A blocking engine shared by every session, fed in the order the scheduler picks.

Jobs (a TTS sentence, an ASR decode) wait here; whenever the worker thread is free the
scheduler sees every waiting job with a fresh view of its session and picks the next one:
earliest deadline first, stale epochs dropped, sessions past their lookahead budget deferred.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from server.clock import Clock
from server.config import SchedulerConfig
from server.errors import RuntimeErrorBase
from server.priority import engine_thread
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.scheduling.scheduler import Scheduler, WorkItem, latest_start_ms

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_S = 0.02  # when every waiting job is deferred, look again after this long


class StaleWork(RuntimeErrorBase):
    """The job's epoch ended before it ran; it was dropped, not run."""

    code = "stale_work"


class ShedWork(RuntimeErrorBase):
    """Optional work (a partial transcript) dropped so that required work goes first."""

    code = "shed_work"


@dataclass(frozen=True)
class JobTag:
    """Who a job is for: the session's current view decides when it runs."""

    session_id: str
    epoch: int
    view: Callable[[], SessionView]


@dataclass
class _Job(Generic[T]):
    item: WorkItem
    tag: JobTag
    fn: Callable[[], T]
    future: asyncio.Future[T]


class EngineQueue:
    """One worker thread; ``run()`` queues a job and returns its result when it has run."""

    def __init__(
        self,
        name: str,
        scheduler: Scheduler,
        clock: Clock,
        on_wait: Callable[[float, bool], None] | None = None,
        deadlines: SchedulerConfig | None = None,
        nice: int = 0,
    ) -> None:
        """``nice``: how much lower than its creator's the worker thread's priority runs
        (``server.priority``; an engine's computing yields to the event loop)."""
        self.name = name
        # called as each job starts: its wait (ms), and whether it starts past its deadline
        self.on_wait = on_wait
        self._deadlines = deadlines or SchedulerConfig()
        self.missed = 0
        self._scheduler = scheduler
        self._clock = clock
        self._pool = ThreadPoolExecutor(
            1, thread_name_prefix=name, initializer=engine_thread, initargs=(nice,)
        )
        self._pending: list[_Job[Any]] = []
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self.dropped_stale = 0
        self.shed = 0  # optional jobs dropped for required work

    @property
    def waiting(self) -> int:
        """Jobs queued and not yet started."""
        return len(self._pending)

    @property
    def required_waiting(self) -> int:
        """Jobs queued, not yet started, that someone is waiting for (not optional)."""
        return sum(not job.item.optional for job in self._pending)

    async def run(
        self,
        tag: JobTag,
        stage: Stage,
        est_cost_ms: float,
        fn: Callable[[], T],
        optional: bool = False,
    ) -> T:
        """Queue ``fn`` for the worker thread; raises StaleWork if its epoch ends first, and
        ShedWork if it is ``optional`` and was dropped for required work."""
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work(), name=self.name)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        now = self._clock.now_ms()
        item = WorkItem(
            next(self._ids), tag.session_id, stage, tag.epoch, est_cost_ms, now, optional
        )
        job = _Job(item, tag, fn, future)
        self._pending.append(job)
        self._wake.set()
        try:
            return await future
        finally:
            if job in self._pending:  # the caller gave up (cancelled): never run it
                self._pending.remove(job)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            job = self._next()
            if job is None:
                await asyncio.sleep(RETRY_S)  # everything waiting is past its budget
                continue
            now = self._clock.now_ms()
            late = now > latest_start_ms(self._deadlines, now, job.item, job.tag.view())
            self.missed += late
            if self.on_wait is not None:
                self.on_wait(now - job.item.enqueued_ms, late)
            try:
                result = await loop.run_in_executor(self._pool, job.fn)
            except Exception as exc:
                if not job.future.done():
                    job.future.set_exception(exc)
            else:
                if not job.future.done():
                    job.future.set_result(result)

    def _next(self) -> _Job[Any] | None:
        jobs = {job.item.item_id: job for job in self._pending if not job.future.done()}
        self._pending = list(jobs.values())
        views = {job.item.session_id: job.tag.view() for job in self._pending}
        plan = self._scheduler.schedule(
            self._clock.now_ms(), [job.item for job in self._pending], views, 1
        )
        for item in plan.stale:
            job = jobs[item.item_id]
            self._pending.remove(job)
            self.dropped_stale += 1
            job.future.set_exception(StaleWork(f"{self.name}: epoch {item.epoch} ended"))
        for item in plan.shed:
            job = jobs[item.item_id]
            self._pending.remove(job)
            self.shed += 1
            job.future.set_exception(ShedWork(f"{self.name}: optional work shed"))
        if not plan.run:
            return None
        job = jobs[plan.run[0].item_id]
        self._pending.remove(job)
        return job

    def forget(self, session_id: str) -> None:
        """The session ended: the scheduler drops what it kept about it."""
        self._scheduler.forget(session_id)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for job in self._pending:
            job.future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
