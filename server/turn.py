"""The turn state machine: who has the floor."""

from __future__ import annotations

import logging
from enum import Enum

from server.errors import InvalidTransition

log = logging.getLogger(__name__)


class TurnState(Enum):
    """Whose turn it is in the conversation."""

    LISTENING = "listening"
    USER_SPEAKING = "user_speaking"
    THINKING = "thinking"
    AGENT_SPEAKING = "agent_speaking"


_L, _U, _T, _A = TurnState
TRANSITIONS: dict[TurnState, frozenset[TurnState]] = {
    # speech start; typed text goes straight to thinking
    _L: frozenset({_U, _T}),
    # end of turn; or the speech was not a turn (noise, empty transcript)
    _U: frozenset({_T, _L}),
    # first audio plays; barge-in before it plays; nothing to say / cancelled / failed
    _T: frozenset({_A, _U, _L}),
    # reply played out or cancelled; barge-in by voice; barge-in by typed text
    _A: frozenset({_L, _U, _T}),
}


class TurnMachine:
    """Holds the turn state; :meth:`to` is the one place it changes (logged ``old -> new``)."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._state = TurnState.LISTENING

    @property
    def state(self) -> TurnState:
        return self._state

    def can(self, new: TurnState) -> bool:
        return new in TRANSITIONS[self._state]

    def to(self, new: TurnState, reason: str) -> None:
        """Change state; raises InvalidTransition for a move the table does not allow."""
        old = self._state
        if new not in TRANSITIONS[old]:
            raise InvalidTransition(f"turn: {old.value} -> {new.value} ({reason}) not allowed")
        self._state = new
        log.info(
            "session %s turn: %s -> %s (%s)", self._session_id[:8], old.value, new.value, reason
        )
