"""Typed events the session runtime emits; the transport serialises them for the data channel.

Names follow the OpenAI Realtime events where one fits. Every event of a response has its epoch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, ClassVar


@dataclass(frozen=True)
class SessionEvent:
    """Base of runtime events; ``type`` is the wire name."""

    type: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class SpeechStarted(SessionEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: float


@dataclass(frozen=True)
class SpeechStopped(SessionEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: float


@dataclass(frozen=True)
class ResponseCreated(SessionEvent):
    type: ClassVar[str] = "response.created"
    epoch: int


class ResponseStatus(StrEnum):
    """How a response ended; the value is the wire string of ``response.done``."""

    COMPLETED = "completed"  # generated and played out
    CANCELLED = "cancelled"  # interrupted: barge-in, typed text or response.cancel
    FAILED = "failed"  # an engine failed or a turn deadline passed


@dataclass(frozen=True)
class ResponseDone(SessionEvent):
    """The end of the response of ``epoch``, and how it ended."""

    type: ClassVar[str] = "response.done"
    epoch: int
    status: ResponseStatus

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "epoch": self.epoch, "status": str(self.status)}


@dataclass(frozen=True)
class ItemTruncated(SessionEvent):
    """After a barge-in: the chunk that was playing was heard up to ``audio_end_ms``."""

    type: ClassVar[str] = "conversation.item.truncated"
    epoch: int
    chunk_id: int
    audio_end_ms: float
    heard_text: str


@dataclass(frozen=True)
class ConditionsApplied(SessionEvent):
    type: ClassVar[str] = "session.updated"
    version: int
    persona: str
    voice: str
    appearance: str
    presence: str = ""


@dataclass(frozen=True)
class TurnTimedOut(SessionEvent):
    """A turn state passed its deadline (server/runtime/turn.py).

    An ``error`` the client can act on, with what was late (``stage``: asr,
    llm, tts, playback). The message is for people.
    """

    type: ClassVar[str] = "error"
    epoch: int
    state: str
    stage: str

    def to_dict(self) -> dict[str, Any]:
        message = {
            "asr": "Sorry, I could not make out what you said in time. Please say it again.",
            "llm": "Sorry, I took too long to think of an answer. Please ask again.",
            "tts": "Sorry, my voice got stuck. Please ask again.",
        }.get(self.stage, "Sorry, that answer took too long and was stopped.")
        return {
            "type": self.type,
            "epoch": self.epoch,
            "error": {
                "type": "server_error",
                "code": "timeout",
                "stage": self.stage,
                "state": self.state,
                "message": message,
            },
        }
