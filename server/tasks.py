"""Tasks with an owner: every task is started through its owner, logged if it fails, and
cancelled and awaited when the owner stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended; its outcome is retrieved (a task
    that had already failed logs no "exception was never retrieved")."""
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class TaskOwner:
    """The tasks of one object (a conversation, a peer), named ``<name>:<owner>``."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}:{self._owner}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s task %s failed", self._owner, task.get_name(), exc_info=task.exception())

    @property
    def running(self) -> list[asyncio.Task[None]]:
        return [t for t in self._tasks if not t.done()]

    async def stop(self, *also: asyncio.Task[Any] | None) -> None:
        """Cancel every task (but the caller's) and ``also``, and wait until they have ended."""
        current = asyncio.current_task()
        tasks: list[asyncio.Task[Any]] = [t for t in self._tasks if t is not current]
        tasks += [t for t in also if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
