"""An asyncio event loop on a background thread, so synchronous tests (hypothesis) can drive
asyncio peers that must keep running (RTP, ICE consent) between two calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """``with LoopThread() as lt: lt.run(coro, timeout_s)``; the loop stops on exit."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)

    def __enter__(self) -> LoopThread:
        self._thread.start()
        return self

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop and wait for its result (at most ``timeout_s`` seconds)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.run(self._cancel_rest(), 10.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        self.loop.close()

    @staticmethod
    async def _cancel_rest() -> None:
        current = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not current]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_asyncgens()
