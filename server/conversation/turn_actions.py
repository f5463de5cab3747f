"""What the floor decides (server/conversation/floor.py) and the conversation carries out
(server/conversation/conversation.py, ``Conversation.act``), in the order given.

Each is a value: the floor reads the session, the detector and the partial transcript, and
returns these; it starts no task, awaits nothing and changes no session state. An action that
no longer applies when its turn comes (the session moved on meanwhile: typed text, a cancel,
a deadline) is skipped by the conversation, as an older epoch's message is.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.conversation.hearing import Hearing
from server.conversation.interjection import AskWords


@dataclass(frozen=True)
class PauseReply:
    """Voice over a reply: it pauses at once (the playback cursor held, every chunk kept) until
    the judge decides. ``arrival_ms``: when that voice arrived (clock ms), from which the
    reaction is timed."""

    arrival_ms: float


@dataclass(frozen=True)
class ResumeReply:
    """The voice over the paused reply was no interruption (``reason``): it plays on from the
    sample where it paused."""

    reason: str


@dataclass(frozen=True)
class TakeFloor:
    """The user's speech starts at ``at_ms`` (input timeline): a new turn, or over a reply the
    one interruption (the session bumps its epoch). ``onset_arrival_ms`` and
    ``confirmed_arrival_ms``: when the voice arrived and was confirmed (clock ms; None when a
    pause came first and is already timed). ``back_ms``: audio before now that is already the
    user's (a judged interjection). ``begin``: the turn's audio starts here; ``partials``: the
    partial loop starts with it, ``judge_words``: asking the LLM whether each pause's words are
    a whole sentence."""

    at_ms: float
    onset_arrival_ms: float | None = None
    confirmed_arrival_ms: float | None = None
    back_ms: float = 0.0
    begin: bool = True
    partials: bool = False
    judge_words: bool = False


@dataclass(frozen=True)
class EndTurn:
    """The user's turn ends at ``at_ms`` (input timeline): transcribe it and reply."""

    at_ms: float


@dataclass(frozen=True)
class HearUtterance:
    """The end-of-turn model hears the utterance as it stands (``hearing``: the pause's
    hearing; ``generation``: its verdict counts only while the pause lasts)."""

    generation: int
    hearing: Hearing


@dataclass(frozen=True)
class TranscribeInterjection:
    """The words of the voice over the paused reply are asked for (from just before its
    onset); the judge hears them when they come."""

    ask: AskWords


@dataclass(frozen=True)
class DropEarly:
    """The reply begun early at the user's pause is dropped (``reason``): the user spoke on."""

    reason: str


TurnAction = (
    PauseReply
    | ResumeReply
    | TakeFloor
    | EndTurn
    | HearUtterance
    | TranscribeInterjection
    | DropEarly
)
