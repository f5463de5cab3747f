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

from server.errors import InvalidItem, UnknownItem
from server.runtime.tools import FunctionCall

TokenCounter = Callable[[str], int]
# when the recent window must slide, it keeps the latest turns that fit this share of its
# budget: its start then stays put for the next turns, and so does the prompt's prefix
WINDOW_KEEP = 0.5
# History.make_room slides it early when less than this share of the budget (or of the turns
# kept) is left for the turns to come
WINDOW_HEADROOM = 0.125


def approx_tokens(text: str) -> int:
    """A model-free token estimate (~4 characters a token); the LLM backend injects its own."""
    return math.ceil(len(text) / 4) if text else 0


class Role(Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"  # a function call's output, as the client gave it


class CacheClass(Enum):
    """How the model context treats a piece of history."""

    ANCHOR = "anchor"  # system persona: pinned, never evicted
    RECENT = "recent"  # latest committed turns: a window that slides
    CURRENT = "current"  # the user's turn in progress: pending until committed


@dataclass(frozen=True)
class Turn:
    """One committed turn (a conversation item). ``truncated``: an agent turn cut short.

    ``item_id``: its id in the conversation. An agent turn also has ``word_ends_ms``: where in
    its audio (ms from the item's first sample) each word of ``text`` ended, so that it can be
    cut to what a client says it played (``conversation.item.truncate``).
    """

    role: Role
    text: str
    epoch: int
    truncated: bool = False
    item_id: str = ""
    word_ends_ms: tuple[float, ...] = ()
    audio_ms: float = 0.0  # agent audio of this item heard (ms); 0 for a user turn
    seq: int = 0  # its place in the order turns were added to the history
    typed: bool = False  # a user message added as text (a conversation item), not spoken
    call: FunctionCall | None = None  # a function_call item (role assistant, no text)
    call_id: str = ""  # a function_call_output item (role tool): the call it answers
    made_by: str = ""  # a call a reply made: the item of that reply's words

    @property
    def said(self) -> bool:
        """Whether the model context shows it: words, a call, or a call's output."""
        return bool(self.text) or self.call is not None or bool(self.call_id)

    @property
    def size_text(self) -> str:
        """What it puts in the model context, to count its tokens by."""
        if self.call is not None:
            return f"{self.call.name} {self.call.arguments}"
        return self.text


@dataclass(frozen=True)
class ContextEntry:
    """One message of the model context with its cache class."""

    cache_class: CacheClass
    role: Role
    text: str
    call: FunctionCall | None = None  # an assistant's function call (text: "")
    call_id: str = ""  # a tool message: the call whose output ``text`` is


def check_audio_end(audio_end_ms: float, audio_ms: float) -> None:
    """A cut at ``audio_end_ms`` of an item with ``audio_ms`` of audio heard: InvalidItem when
    past it (by more than a millisecond of rounding)."""
    if audio_end_ms > audio_ms + 1.0:
        raise InvalidItem(
            f"audio_end_ms {audio_end_ms:.0f} is past the item's audio ({audio_ms:.0f} ms)"
        )


def _join(a: str, b: str) -> str:
    return f"{a} {b}".strip() if a and b else (a or b)


class History:
    """The session's conversation memory."""

    def __init__(self, persona: str, max_turns: int, count_tokens: TokenCounter = approx_tokens):
        self._anchor = persona
        self._turns: deque[Turn] = deque(maxlen=max_turns)
        self._current_user = ""
        self._count = count_tokens
        self._added = 0  # turns added so far: the ``seq`` of the latest
        self._window_from = 1  # ``seq`` of the oldest turn the recent window may hold
        self.window_keep = WINDOW_KEEP

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

    def end_user_turn(self, epoch: int, item_id: str = "") -> Turn | None:
        """Commit the current user text as a turn (item ``item_id``); None if the user said
        nothing."""
        text, self._current_user = self._current_user, ""
        if not text:
            return None
        turn = Turn(Role.USER, text, epoch, item_id=item_id, seq=self._next_seq())
        self._turns.append(turn)
        return turn

    def _next_seq(self) -> int:
        self._added += 1
        return self._added

    def add_user_item(self, text: str, epoch: int, item_id: str) -> Turn:
        """A user message added as a whole (typed), whatever turn is in progress."""
        turn = Turn(
            Role.USER, text.strip(), epoch, item_id=item_id, seq=self._next_seq(), typed=True
        )
        self._turns.append(turn)
        return turn

    def commit_agent_text(
        self,
        epoch: int,
        text: str,
        truncated: bool = False,
        item_id: str = "",
        word_ends_ms: tuple[float, ...] = (),
        audio_ms: float = 0.0,
    ) -> None:
        """Append heard agent text to that epoch's agent turn (created on first commit);
        ``word_ends_ms``: where each of its words ended, in ms from the chunk's first sample;
        ``audio_ms``: how much of the chunk's audio was heard."""
        if not text and not truncated:
            return
        if len(word_ends_ms) != len(text.split()):  # no timing: every word counts as heard
            word_ends_ms = (0.0,) * len(text.split())
        at = self._words_place(item_id)
        last = self._turns[at - 1] if at else None
        same = last.item_id == item_id if last is not None and item_id else True
        words = last is not None and last.role is Role.ASSISTANT and last.call is None
        if last is not None and words and last.epoch == epoch and same:
            offset = last.audio_ms
            self._turns[at - 1] = replace(
                last,
                text=_join(last.text, text),
                truncated=last.truncated or truncated,
                word_ends_ms=last.word_ends_ms + tuple(offset + e for e in word_ends_ms),
                audio_ms=offset + audio_ms,
            )
        elif text:
            turn = Turn(
                Role.ASSISTANT,
                text,
                epoch,
                truncated,
                item_id,
                word_ends_ms,
                audio_ms,
                seq=self._next_seq(),
            )
            if at == len(self._turns):
                self._turns.append(turn)
            else:  # before the calls (a full deque forgets its oldest turn first)
                if len(self._turns) == self._turns.maxlen:
                    self._turns.popleft()
                    at -= 1
                self._turns.insert(at, turn)

    def _words_place(self, item_id: str) -> int:
        """Where the words of the reply item ``item_id`` go: before the calls that reply made
        while they played, and those calls' outputs (one may come before the words are
        heard)."""
        at = len(self._turns)
        if not item_id:
            return at
        made = {t.call.call_id for t in self._turns if t.call is not None and t.made_by == item_id}
        while at:
            turn = self._turns[at - 1]
            ours = turn.call is not None and turn.made_by == item_id
            if not (ours or (turn.call_id and turn.call_id in made)):
                break
            at -= 1
        return at

    def add_call(self, call: FunctionCall, epoch: int, item_id: str, made_by: str = "") -> Turn:
        """A function call the agent made (``made_by``: its reply's words' item) or a client
        replays, as item ``item_id``."""
        seq = self._next_seq()
        turn = Turn(Role.ASSISTANT, "", epoch, item_id=item_id, seq=seq, call=call, made_by=made_by)
        self._turns.append(turn)
        return turn

    def add_call_output(self, call_id: str, output: str, epoch: int, item_id: str) -> Turn:
        """The output the client gave for call ``call_id``, as item ``item_id``."""
        seq = self._next_seq()
        turn = Turn(Role.TOOL, output, epoch, item_id=item_id, seq=seq, call_id=call_id)
        self._turns.append(turn)
        return turn

    def call(self, call_id: str) -> Turn | None:
        """The function_call item of ``call_id``, None if the history holds none."""
        for turn in reversed(self._turns):
            if turn.call is not None and turn.call.call_id == call_id:
                return turn
        return None

    # --- items by id ----------------------------------------------------------------------------
    def item(self, item_id: str) -> Turn:
        """The turn with ``item_id``; UnknownItem if there is none."""
        for turn in self._turns:
            if turn.item_id and turn.item_id == item_id:
                return turn
        raise UnknownItem(f"no conversation item {item_id[:64]!r}")

    @property
    def last_item_id(self) -> str | None:
        """The id of the newest item, None when there is none."""
        return self._turns[-1].item_id or None if self._turns else None

    def delete(self, item_id: str) -> Turn:
        """Forget the item ``item_id`` (UnknownItem if there is none)."""
        turn = self.item(item_id)
        self._turns.remove(turn)
        return turn

    def truncate(self, item_id: str, audio_end_ms: float) -> Turn:
        """Cut the agent item ``item_id`` to the words whose audio ended by ``audio_end_ms``
        (ms from its first sample). UnknownItem for an unknown id, InvalidItem for a user item
        or a position past the item's audio."""
        turn = self.item(item_id)
        if turn.role is not Role.ASSISTANT or turn.call is not None:
            raise InvalidItem("only an assistant message has audio to truncate")
        check_audio_end(audio_end_ms, turn.audio_ms)
        kept = sum(1 for end in turn.word_ends_ms if end <= audio_end_ms)
        words = turn.text.split()
        cut = replace(
            turn,
            text=" ".join(words[:kept]),
            truncated=turn.truncated or kept < len(words),
            word_ends_ms=turn.word_ends_ms[:kept],
            audio_ms=min(turn.audio_ms, audio_end_ms),
        )
        self._turns[self._turns.index(turn)] = cut
        return cut

    def recent_window(self, budget_tokens: int) -> tuple[Turn, ...]:
        """The latest turns for the model context (oldest first), within ``budget_tokens``.

        The window's start stays where it was while the turns since then fit the budget and
        the history still holds its first turn, so the prompt before the newest turns
        (persona and window) is the one the engine has cached. Else it moves on at once to
        the latest turns that fit ``window_keep`` of the budget and of the turns the history
        keeps: a window that slid one turn at a time would change the prompt's start at every
        turn, and the engine would read the whole window again for every reply and warm-up.
        """
        since = self._since_window_start()
        forgotten = bool(since) and since[0].seq != self._window_from  # its first turn is gone
        if forgotten or not self._fits(since, budget_tokens, 1.0):
            since = self._slide(since, budget_tokens)
        return tuple(since)

    def make_room(self, budget_tokens: int) -> bool:
        """Move the recent window on now if it has less than ``WINDOW_HEADROOM`` of its
        budget (or of the turns the history keeps) left for the turns to come. Called in a
        quiet moment (a reply has played out: server/conversation/reply.py), so that the
        engine reads the moved window while nobody waits, not when the user's next turn
        pushes it over and the reply waits. Whether it moved."""
        since = self._since_window_start()
        if self._fits(since, budget_tokens, 1.0 - WINDOW_HEADROOM):
            return False
        start = self._window_from
        self._slide(since, budget_tokens)
        return self._window_from != start

    def _since_window_start(self) -> list[Turn]:
        return [t for t in self._turns if t.seq >= self._window_from]

    def _fits(self, turns: list[Turn], budget_tokens: int, share: float) -> bool:
        """Whether ``turns`` fit ``share`` of the budget and of the turns the history keeps."""
        most = self._turns.maxlen or len(turns)
        tokens = sum(self._count(t.size_text) for t in turns)
        return tokens <= budget_tokens * share and len(turns) <= most * share

    def _slide(self, since: list[Turn], budget_tokens: int) -> list[Turn]:
        """The window's start moves on to the latest turns that fit ``window_keep``."""
        most = int((self._turns.maxlen or len(since)) * self.window_keep)
        picked = self._latest(since[-most:] if most else [], budget_tokens * self.window_keep)
        if not picked:  # the newest turn alone is longer than that share: it alone, if it fits
            picked = self._latest(since[-1:], budget_tokens)
        self._window_from = picked[0].seq if picked else self._added + 1
        return picked

    def _latest(self, turns: list[Turn], budget_tokens: float) -> list[Turn]:
        """The latest of ``turns`` whose token count fits ``budget_tokens`` (oldest first)."""
        picked: list[Turn] = []
        used = 0
        for turn in reversed(turns):
            used += self._count(turn.size_text)
            if used > budget_tokens:
                break
            picked.append(turn)
        return picked[::-1]

    def context(self, budget_tokens: int) -> tuple[ContextEntry, ...]:
        """Anchor, then the recent window, then the current user turn if it has words."""
        entries = [ContextEntry(CacheClass.ANCHOR, Role.SYSTEM, self._anchor)]
        entries += [
            ContextEntry(CacheClass.RECENT, t.role, t.text, t.call, t.call_id)
            for t in self.recent_window(budget_tokens)
            if t.said  # an item truncated to nothing says nothing
        ]
        if self._current_user:
            entries.append(ContextEntry(CacheClass.CURRENT, Role.USER, self._current_user))
        return tuple(entries)
