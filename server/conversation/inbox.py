"""Client messages on their way in: parsed into typed events and queued (bounded), or
answered with one ``error`` each."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from server.conversation.protocol import ProtocolError, error_event, parse_client_event
from server.conversation.realtime_client import RealtimeEvent

log = logging.getLogger(__name__)

MAX_INBOX = 64


class Inbox:
    """The client events of one conversation, handled one at a time, in order."""

    def __init__(
        self, session_id: str, max_event_bytes: int, emit: Callable[[dict[str, Any]], None]
    ) -> None:
        self._session_id = session_id
        self._max_event_bytes = max_event_bytes
        self._emit = emit
        self._queue: asyncio.Queue[RealtimeEvent] = asyncio.Queue(maxsize=MAX_INBOX)
        self._busy = False  # an event is being handled
        # the dialect's parser (the native one until a GA channel opens)
        self.parse: Callable[[str | bytes, int], RealtimeEvent] = parse_client_event

    def receive(self, raw: str | bytes) -> None:
        """One client message: parsed and queued, or answered with one ``error``. Runs inside
        the transport's receive path, where an exception would end it: none escapes."""
        try:
            event = self.parse(raw, self._max_event_bytes)
        except ProtocolError as exc:
            self._emit(exc.to_event())
            return
        except Exception:
            log.exception("session %s: could not parse a client event", self._session_id[:8])
            message = "the event could not be handled"
            self._emit(error_event("server_error", "internal_error", message))
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            error = ProtocolError("rate_limited", "too many events queued", event.event_id)
            self._emit(error.to_event())

    async def next(self) -> RealtimeEvent:
        return await self._queue.get()

    @property
    def idle(self) -> bool:
        """No client event waits or is being handled."""
        return self._queue.empty() and not self._busy

    async def serve(self, handle: Callable[[RealtimeEvent], Awaitable[None]]) -> None:
        """Hands the client events to ``handle`` one at a time, in order (until cancelled)."""
        while True:
            event = await self.next()
            self._busy = True
            try:
                await handle(event)
            finally:
                self._busy = False
