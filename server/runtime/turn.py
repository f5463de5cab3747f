"""The turn state machine: who has the floor, and for how long at most.

Liveness invariant: every state but LISTENING ends within its deadline, counted from entering
it (not from when some engine job starts): USER_SPEAKING ends as at a pause (the reply starts),
THINKING and AGENT_SPEAKING end in LISTENING with a ``timeout`` error naming the stage that was
late, and PAUSED (voice over a reply, not yet judged an interruption) is judged then.
:meth:`TurnMachine.overdue` says when a deadline has passed; the session acts on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from server.clock import Clock
from server.errors import InvalidTransition

log = logging.getLogger(__name__)


class TurnState(Enum):
    """Whose turn it is in the conversation."""

    LISTENING = "listening"
    USER_SPEAKING = "user_speaking"
    THINKING = "thinking"
    AGENT_SPEAKING = "agent_speaking"
    PAUSED = "paused"  # voice over a reply: playback held until it is judged an interruption


_L, _U, _T, _A, _P = TurnState
TRANSITIONS: dict[TurnState, frozenset[TurnState]] = {
    # speech start; typed text goes straight to thinking
    _L: frozenset({_U, _T}),
    # end of turn; or the speech was not a turn (noise, empty transcript)
    _U: frozenset({_T, _L}),
    # first audio plays; barge-in before it plays (voice; typed text restarts thinking);
    # nothing to say / cancelled / failed / timed out; voice heard over it (pause first)
    _T: frozenset({_A, _U, _T, _L, _P}),
    # reply played out or cancelled; barge-in by voice; barge-in by typed text; voice heard
    _A: frozenset({_L, _U, _T, _P}),
    # not an interruption: the reply resumes (speaking, or still thinking); an interruption
    # by voice; typed text; cancelled, failed, timed out or played out
    _P: frozenset({_A, _T, _U, _L}),
}


@dataclass(frozen=True)
class TurnDeadlines:
    """How long (ms) each state but LISTENING may last, from entering it."""

    user_speaking_ms: float
    thinking_ms: float
    agent_speaking_ms: float
    paused_ms: float = 2_000.0

    def of(self, state: TurnState) -> float | None:
        """The deadline of ``state``; None for LISTENING, which may last for ever."""
        return {
            TurnState.LISTENING: None,
            TurnState.USER_SPEAKING: self.user_speaking_ms,
            TurnState.THINKING: self.thinking_ms,
            TurnState.AGENT_SPEAKING: self.agent_speaking_ms,
            TurnState.PAUSED: self.paused_ms,
        }[state]


class TurnMachine:
    """Holds the turn state and when it was entered; :meth:`to` is the one place it changes
    (logged ``old -> new``)."""

    def __init__(self, session_id: str, clock: Clock, deadlines: TurnDeadlines) -> None:
        self._session_id = session_id
        self._clock = clock
        self._deadlines = deadlines
        self._state = TurnState.LISTENING
        self._entered_ms = clock.now_ms()

    @property
    def state(self) -> TurnState:
        return self._state

    @property
    def entered_ms(self) -> float:
        """When (clock ms) the current state was entered."""
        return self._entered_ms

    def overdue(self) -> float | None:
        """How long (ms) the current state has been in place if that is past its deadline;
        None while within it (and always in LISTENING)."""
        deadline = self._deadlines.of(self._state)
        spent = self._clock.now_ms() - self._entered_ms
        return spent if deadline is not None and spent >= deadline else None

    def pause_for(self, paused_ms: float) -> None:
        """The deadline waited ``paused_ms`` (no connection carried the turn): it moves on."""
        self._entered_ms += max(0.0, paused_ms)

    def can(self, new: TurnState) -> bool:
        return new in TRANSITIONS[self._state]

    def to(self, new: TurnState, reason: str) -> None:
        """Change state; raises InvalidTransition for a move the table does not allow."""
        old = self._state
        if new not in TRANSITIONS[old]:
            raise InvalidTransition(f"turn: {old.value} -> {new.value} ({reason}) not allowed")
        self._state = new
        self._entered_ms = self._clock.now_ms()
        log.info(
            "session %s turn: %s -> %s (%s)", self._session_id[:8], old.value, new.value, reason
        )
