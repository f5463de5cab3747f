"""The function calls a session's agent made that wait for the client's output.

A call waits from the moment it is made until its ``function_call_output`` comes, an
interruption cancels it (the user spoke, typed, or cancelled the reply: what the call was
for has moved on), or its deadline passes (the conversation then apologises instead of
hanging). An output that comes for a call no longer waiting is kept in history, but the
``response.create`` that follows it starts no reply.

I/O-free: times are ms on the session clock, given by the caller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

log = logging.getLogger(__name__)


class CallState(Enum):
    WAITING = "waiting"  # made; its output has not come
    ANSWERED = "answered"  # its output came in time
    CANCELLED = "cancelled"  # an interruption came first
    TIMED_OUT = "timed_out"  # its deadline passed first


@dataclass
class _Call:
    state: CallState
    deadline_ms: float


MAX_KEPT = 64  # calls remembered (a long conversation stays bounded)


class PendingCalls:
    """Which calls wait for their output, and whether a reply may follow an output."""

    def __init__(self, session_id: str = "") -> None:
        self._sid = session_id[:8]
        self._calls: dict[str, _Call] = {}
        self._late_output = False  # the newest item is an output nobody waits for any more
        self._replied: str | None = None  # the output item a reply was started for last

    def _to(self, call_id: str, state: CallState, why: str) -> None:
        call = self._calls[call_id]
        old = call.state.value
        log.info("session %s call %s: %s -> %s (%s)", self._sid, call_id, old, state.value, why)
        call.state = state

    def made(self, call_id: str, deadline_ms: float) -> None:
        """The agent made call ``call_id``; its output is due by ``deadline_ms``."""
        self._calls[call_id] = _Call(CallState.WAITING, deadline_ms)
        while len(self._calls) > MAX_KEPT:
            del self._calls[next(iter(self._calls))]
        self._late_output = False

    def state(self, call_id: str) -> CallState | None:
        call = self._calls.get(call_id)
        return None if call is None else call.state

    @property
    def waiting(self) -> tuple[str, ...]:
        return tuple(c for c, call in self._calls.items() if call.state is CallState.WAITING)

    def answered(self, call_id: str) -> bool:
        """The client gave call ``call_id``'s output: whether it came while the call waited
        (False: late, cancelled or unknown; a reply asked for right after starts none)."""
        call = self._calls.get(call_id)
        if call is None or call.state is not CallState.WAITING:
            self._late_output = True
            return False
        self._to(call_id, CallState.ANSWERED, "its output came")
        self._late_output = False
        return True

    def other_item(self) -> None:
        """An item that is no call's output was added: replies may follow again."""
        self._late_output = False

    def reply_wanted(self, output_item: str | None = None) -> bool:
        """Whether ``response.create`` now should start a reply: not right after the output
        of a call nobody waits for any more, nor a second one for the output ``output_item``
        (the newest item; a client may ask once per output of a reply that made several)."""
        if self._late_output:
            return False
        return output_item is None or output_item != self._replied

    def replying_to(self, output_item: str) -> None:
        """A reply to the output item ``output_item`` (the newest) starts, or waits to."""
        self._replied = output_item

    def interrupted(self, why: str) -> tuple[str, ...]:
        """An interruption cancels every waiting call; the ones it cancelled."""
        cancelled = self.waiting
        for call_id in cancelled:
            self._to(call_id, CallState.CANCELLED, why)
        return cancelled

    def due(self, now_ms: float) -> tuple[str, ...]:
        """The waiting calls whose deadline has passed by ``now_ms``, now timed out."""
        late = tuple(
            call_id
            for call_id, call in self._calls.items()
            if call.state is CallState.WAITING and call.deadline_ms <= now_ms
        )
        for call_id in late:
            self._to(call_id, CallState.TIMED_OUT, "no output by its deadline")
        return late
