"""Events a conversation sends that the runtime session does not make (server/runtime/events.py
has those): transcripts, the session's description, a reply's timings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from server.runtime.session import Session


@dataclass(frozen=True)
class TranscriptionDelta:
    """A partial transcript of the user's turn; ``stable``: the words two partials agreed on."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    transcript: str
    stable: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class TranscriptionCompleted:
    """The final transcript of the user's turn of ``epoch``."""

    type: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    epoch: int
    transcript: str
    item_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class TranscriptDelta:
    """The text of one reply chunk, sent when the chunk opens (before its audio plays)."""

    type: ClassVar[str] = "response.audio_transcript.delta"
    epoch: int
    chunk_id: int
    delta: str
    response_id: str = ""
    item_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class SessionCreated:
    """The session as a newly attached client finds it. ``resume_token`` lets this client's
    holder attach a new connection within ``resume_window_s`` after this one is lost (once);
    ``resumed``: this connection resumed the conversation."""

    type: ClassVar[str] = "session.created"
    session_id: str
    epoch: int
    persona: str
    voice: str
    appearance: str
    appearances: tuple[str, ...]
    audio: bool
    video: bool
    resume_token: str | None = None
    resume_window_s: float = 0.0
    resumed: bool = False

    @classmethod
    def of(
        cls,
        session: Session,
        appearances: tuple[str, ...],
        media: tuple[bool, bool],
        resume_token: str | None,
        resume_window_s: float,
    ) -> SessionCreated:
        """``session`` as it stands; ``media``: the link sends audio, video."""
        c = session.conditions
        persona, voice, look = c.persona, c.voice, c.appearance
        return cls(
            session.session_id,
            session.epoch,
            persona,
            voice,
            look,
            tuple(appearances),
            *media,
            resume_token,
            resume_window_s,
        )

    def to_dict(self) -> dict[str, Any]:
        session: dict[str, Any] = {
            "id": self.session_id,
            "epoch": self.epoch,
            "persona": self.persona,
            "voice": self.voice,
            "appearance": self.appearance,
            "appearances": list(self.appearances),
            "audio": self.audio,
            "video": self.video,
        }
        if self.resume_token is not None:
            session["resume_token"] = self.resume_token
            session["resume_window_s"] = self.resume_window_s
        return {"type": self.type, "session": session, "resumed": self.resumed}


@dataclass(frozen=True)
class ResponseTimings:
    """The stage times (ms) and token counts of the client's own reply that was heard."""

    type: ClassVar[str] = "response.timings"
    epoch: int
    status: str
    timings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "epoch": self.epoch, "status": self.status, **self.timings}


@dataclass(frozen=True)
class BargeInReaction:
    """How long (ms) the reply took to go silent after the user's voice began (the gate's
    onset), as the server measured it for this session's own barge-in."""

    type: ClassVar[str] = "input_audio_buffer.barge_in"
    reaction_ms: float
    confirmed_reaction_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}
