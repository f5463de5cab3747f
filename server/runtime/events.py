"""Typed events the session runtime emits; the transport serialises them for the data channel.

Names follow the OpenAI Realtime events where one fits. Every event of a response has its epoch,
and the ids of the conversation's items and responses (server/wire/realtime_wire.py
turns them into the OpenAI Realtime GA shapes).
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
    """The user started speaking; ``item_id``: the user item the speech will become."""

    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: float
    item_id: str = ""


@dataclass(frozen=True)
class SpeechStopped(SessionEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: float
    item_id: str = ""


@dataclass(frozen=True)
class InputCommitted(SessionEvent):
    """The user's spoken turn ended: it becomes item ``item_id``, after ``previous_item_id``."""

    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None


@dataclass(frozen=True)
class InputCleared(SessionEvent):
    """The user's speech in progress was discarded (``input_audio_buffer.clear``)."""

    type: ClassVar[str] = "input_audio_buffer.cleared"


@dataclass(frozen=True)
class UserItemAdded(SessionEvent):
    """A typed user message became item ``item_id``, after ``previous_item_id``."""

    type: ClassVar[str] = "conversation.item.created"
    item_id: str
    text: str
    previous_item_id: str | None


@dataclass(frozen=True)
class CallItemAdded(SessionEvent):
    """A client added a function call's output (``item_type`` ``function_call_output``:
    ``output``) or a function call (``function_call``: ``name``, ``arguments``) as item
    ``item_id``, after ``previous_item_id``."""

    type: ClassVar[str] = "conversation.item.created"
    item_id: str
    previous_item_id: str | None
    item_type: str
    call_id: str
    output: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class FunctionCallMade(SessionEvent):
    """The response of ``epoch`` (``response_id``) called function ``name`` with ``arguments``
    (a JSON object's text): item ``item_id`` (``call_id``), after ``previous_item_id``. The
    client runs it and gives its output as a ``function_call_output`` item."""

    type: ClassVar[str] = "response.function_call_arguments.done"
    epoch: int
    response_id: str
    item_id: str
    call_id: str
    name: str
    arguments: str
    previous_item_id: str | None


@dataclass(frozen=True)
class OwnToolRan(SessionEvent):
    """The reply of ``epoch`` called one of the avatar's own tools (an expression, a look, an
    appearance), which the server ran: its ``arguments`` and ``output`` (JSON text)."""

    type: ClassVar[str] = "avatar.tool"
    epoch: int
    call_id: str
    name: str
    arguments: str
    output: str


@dataclass(frozen=True)
class ItemDeleted(SessionEvent):
    type: ClassVar[str] = "conversation.item.deleted"
    item_id: str


@dataclass(frozen=True)
class ItemRetrieved(SessionEvent):
    """A conversation item as the history holds it (an agent item: the words heard, when it
    was cut short). ``typed``: a user message added as text, not spoken."""

    type: ClassVar[str] = "conversation.item.retrieved"
    item_id: str
    role: str
    text: str
    truncated: bool = False
    typed: bool = False
    call_id: str = ""  # a function_call item's (then ``name`` is set) or its output's
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class ResponseCreated(SessionEvent):
    """A response began: ``response_id``, and ``item_id`` of the assistant item it makes."""

    type: ClassVar[str] = "response.created"
    epoch: int
    response_id: str = ""
    item_id: str = ""
    output: str = "audio"  # or "text": a text-only reply


@dataclass(frozen=True)
class OutputAudioStarted(SessionEvent):
    """The first audio of response ``response_id`` went out."""

    type: ClassVar[str] = "output_audio_buffer.started"
    epoch: int
    response_id: str


@dataclass(frozen=True)
class OutputAudioStopped(SessionEvent):
    """Response ``response_id`` played out to its end."""

    type: ClassVar[str] = "output_audio_buffer.stopped"
    epoch: int
    response_id: str


@dataclass(frozen=True)
class OutputAudioCleared(SessionEvent):
    """An interruption flushed the audio of response ``response_id`` that was still queued."""

    type: ClassVar[str] = "output_audio_buffer.cleared"
    epoch: int
    response_id: str


@dataclass(frozen=True)
class OutputAudioPaused(SessionEvent):
    """Voice was heard over response ``response_id``: its audio is held at ``audio_end_ms`` of
    its item (ms heard so far), output position ``position_ms``, until it is judged."""

    type: ClassVar[str] = "output_audio_buffer.paused"
    epoch: int
    response_id: str
    item_id: str
    audio_end_ms: float
    position_ms: float


@dataclass(frozen=True)
class OutputAudioResumed(SessionEvent):
    """That voice was no interruption (``reason``): the audio plays on from the sample where
    it paused, ``paused_ms`` later; output positions announced after the pause (visemes) move
    later by ``paused_ms``."""

    type: ClassVar[str] = "output_audio_buffer.resumed"
    epoch: int
    response_id: str
    item_id: str
    audio_end_ms: float
    paused_ms: float
    reason: str


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
    response_id: str = ""
    item_id: str = ""  # its assistant item (in history only once a word of it was heard)
    transcript: str = ""  # what of it was heard

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "type": self.type, "status": str(self.status)}


@dataclass(frozen=True)
class ItemTruncated(SessionEvent):
    """After a barge-in: the chunk that was playing was heard up to ``audio_end_ms`` (of the
    chunk; 0 with no ``heard_text``: cut between two chunks, before this one began);
    ``item_audio_end_ms``: the same place in the whole assistant item ``item_id``."""

    type: ClassVar[str] = "conversation.item.truncated"
    epoch: int
    chunk_id: int
    audio_end_ms: float
    heard_text: str
    item_id: str = ""
    item_audio_end_ms: float = 0.0


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
