"""Conversation history in three cache classes: anchor, recent window, current turn.

Only what the user actually heard is ever stored for the agent: chunks are committed here once
played, and a barge-in commits only the played prefix of the chunk that was playing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

TokenCounter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """A model-free token estimate (~4 characters a token); the LLM backend injects its own."""
    return math.ceil(len(text) / 4) if text else 0


class Role(Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class CacheClass(Enum):
    """How the model context treats a piece of history."""

    ANCHOR = "anchor"  # system persona: pinned, never evicted
    RECENT = "recent"  # latest committed turns: a window that slides
    CURRENT = "current"  # the user's turn in progress: pending until committed


@dataclass(frozen=True)
class Turn:
    """One committed turn. ``truncated``: an agent turn cut short by a barge-in."""

    role: Role
    text: str
    epoch: int
    truncated: bool = False


@dataclass(frozen=True)
class ContextEntry:
    """One message of the model context with its cache class."""

    cache_class: CacheClass
    role: Role
    text: str


def _join(a: str, b: str) -> str:
    return f"{a} {b}".strip() if a and b else (a or b)


class History:
    """The session's conversation memory."""

    def __init__(self, persona: str, max_turns: int, count_tokens: TokenCounter = approx_tokens):
        self._anchor = persona
        self._turns: deque[Turn] = deque(maxlen=max_turns)
        self._current_user = ""
        self._count = count_tokens

    @property
    def anchor(self) -> str:
        return self._anchor

    def set_anchor(self, persona: str) -> None:
        """Replace the pinned persona (called at a chunk boundary only)."""
        self._anchor = persona

    @property
    def turns(self) -> tuple[Turn, ...]:
        return tuple(self._turns)

    @property
    def current_user_text(self) -> str:
        return self._current_user

    def set_user_text(self, text: str) -> None:
        """The user's words so far in the current turn (latest partial or final transcript)."""
        self._current_user = text.strip()

    def start_user_turn(self) -> None:
        """A new user turn begins (speech start or barge-in); nothing of it is known yet."""
        self._current_user = ""

    def end_user_turn(self, epoch: int) -> Turn | None:
        """Commit the current user text as a turn; None if the user said nothing."""
        text, self._current_user = self._current_user, ""
        if not text:
            return None
        turn = Turn(Role.USER, text, epoch)
        self._turns.append(turn)
        return turn

    def commit_agent_text(self, epoch: int, text: str, truncated: bool = False) -> None:
        """Append heard agent text to that epoch's agent turn (created on first commit)."""
        if not text and not truncated:
            return
        last = self._turns[-1] if self._turns else None
        if last is not None and last.role is Role.ASSISTANT and last.epoch == epoch:
            self._turns[-1] = replace(
                last, text=_join(last.text, text), truncated=last.truncated or truncated
            )
        elif text:
            self._turns.append(Turn(Role.ASSISTANT, text, epoch, truncated))

    def recent_window(self, budget_tokens: int) -> tuple[Turn, ...]:
        """The latest turns whose token count fits ``budget_tokens`` (oldest first)."""
        picked: list[Turn] = []
        used = 0
        for turn in reversed(self._turns):
            cost = self._count(turn.text)
            if used + cost > budget_tokens:
                break
            picked.append(turn)
            used += cost
        return tuple(reversed(picked))

    def context(self, budget_tokens: int) -> tuple[ContextEntry, ...]:
        """Anchor, then the recent window, then the current user turn if it has words."""
        entries = [ContextEntry(CacheClass.ANCHOR, Role.SYSTEM, self._anchor)]
        entries += [
            ContextEntry(CacheClass.RECENT, t.role, t.text)
            for t in self.recent_window(budget_tokens)
        ]
        if self._current_user:
            entries.append(ContextEntry(CacheClass.CURRENT, Role.USER, self._current_user))
        return tuple(entries)
