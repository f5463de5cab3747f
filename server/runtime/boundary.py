"""Condition changes (persona, voice, appearance, presence) applied at chunk boundaries."""

from __future__ import annotations

from collections import deque

from server.runtime.conditions import ConditionQueue, Conditions
from server.runtime.events import ConditionsApplied, SessionEvent
from server.runtime.history import History


class ConditionGate:
    """The conditions in force and those queued (server/runtime/conditions.py).

    Applying a change re-anchors ``history`` on the new persona and tells the client
    (``session.updated`` into ``events``); both are the session's own.
    """

    def __init__(
        self, queue: ConditionQueue, history: History, events: deque[SessionEvent]
    ) -> None:
        self._queue = queue
        self._history = history
        self._events = events

    @property
    def current(self) -> Conditions:
        """Conditions in force for chunks opened now."""
        return self._queue.current

    @property
    def pending(self) -> bool:
        """Whether changes wait for the next boundary."""
        return bool(self._queue.pending)

    def request(self, changes: dict[str, object]) -> None:
        """Queue a client's validated changes; an invalid request changes nothing."""
        self._queue.request(changes)

    def observe(self, note: str) -> None:
        """Queue vision's note on the user (present / stepped away)."""
        self._queue.observe(note)

    def apply(self) -> Conditions:
        """A chunk boundary: queued changes apply; the conditions now in force."""
        before = self._queue.current.version
        now = self._queue.at_boundary()
        if now.version != before:
            self._history.set_anchor(now.anchor())
            self._events.append(
                ConditionsApplied(now.version, now.persona, now.voice, now.appearance, now.presence)
            )
        return now
