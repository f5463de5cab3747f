"""Client messages on their way in: parsed into typed events and queued (bounded), or
answered with one ``error`` each."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from server.clock import Clock, MonotonicClock
from server.runtime.budget import Admission, Rate, Throttle
from server.wire.protocol import ProtocolError, error_event
from server.wire.realtime_client import RealtimeEvent, parse_native_event

log = logging.getLogger(__name__)

MAX_INBOX = 64
NO_LIMIT = Rate(0.0, 1.0)


class Inbox:
    """The client events of one conversation, handled one at a time, in order. ``rate``:
    events a second and a burst, past which they are dropped before they are parsed
    (``limited`` counts each), unanswered but for one ``rate_limited`` error a throttling
    episode; ``flood_s``: see :class:`server.runtime.budget.Throttle`."""

    def __init__(
        self,
        session_id: str,
        max_event_bytes: int,
        emit: Callable[[dict[str, Any]], None],
        rate: Rate = NO_LIMIT,
        flood_s: float = 0.0,
        clock: Clock | None = None,
        limited: Callable[[], None] = lambda: None,
    ) -> None:
        self._session_id = session_id
        self._max_event_bytes = max_event_bytes
        self._emit = emit
        self._throttle = Throttle(rate, flood_s)
        self._rate = rate
        self._clock = clock or MonotonicClock()
        self._limited = limited
        self._queue: asyncio.Queue[RealtimeEvent] = asyncio.Queue(maxsize=MAX_INBOX)
        self._busy = False  # an event is being handled
        # the dialect's parser (the native one until a GA channel opens)
        self.parse: Callable[[str | bytes, int], RealtimeEvent] = parse_native_event

    def receive(self, raw: str | bytes) -> bool:
        """One client message: parsed and queued, or answered with one ``error``, or over the
        budget dropped. False when its sender floods far past the budget: end the session.
        Runs inside the transport's receive path, where an exception would end it: none
        escapes."""
        admission = self._throttle.admit(self._clock.now_ms())
        if admission is not Admission.TAKE:
            self._limited()
            if admission is Admission.REFUSE:
                message = (
                    f"more than {self._rate.per_s:g} events a second: events are dropped "
                    "unanswered until they slow down"
                )
                self._emit(ProtocolError("rate_limited", message).to_event())
            return admission is not Admission.END
        self._parse(raw)
        return True

    def _parse(self, raw: str | bytes) -> None:
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
