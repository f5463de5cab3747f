"""Client events of the ``oai-events`` channel (the OpenAI Realtime GA dialect), parsed and
validated into typed values; hostile input is refused as in the native dialect
(server/wire/protocol.py decodes both).

GA client events: ``session.update``, ``conversation.item.create`` (a user message; it does
not answer by itself), ``response.create`` (answers; per-response ``instructions``),
``response.cancel``, ``input_audio_buffer.clear``, ``output_audio_buffer.clear``,
``conversation.item.truncate``, ``conversation.item.delete``, ``conversation.item.retrieve``.
Extensions: ``x-avatar.session.
update`` (the native ``session.update``: persona, voice, appearance) and ``x-avatar.playback.
ack``. Audio travels on the WebRTC track: ``input_audio_buffer.append`` and ``.commit`` are
refused, as is everything else this server does not do (each with a clear ``error``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from server.runtime.conditions import MAX_PERSONA_CHARS
from server.runtime.tools import FunctionTool, ToolChoice, ToolSettings
from server.wire.protocol import (
    MAX_QUOTED_CHARS,
    ClientEvent,
    PlaybackAck,
    ProtocolError,
    ResponseCancel,
    SessionUpdate,
    checked_text,
    decode_event,
    milliseconds,
    parse_client_event,
    quoted,
    session_fields,
)
from server.wire.realtime_session import SessionPatch, output_modalities, parse_session
from server.wire.realtime_tools import (
    CallCreate,
    CallOutputCreate,
    ToolsUpdate,
    parse_call_item,
    parse_tool_choice,
    parse_tools,
)

EXTENSION_PREFIX = "x-avatar."


@dataclass(frozen=True)
class ItemCreate:
    """A user message added to the conversation (``item_id``: the client's, or None)."""

    text: str
    item_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True)
class ResponseCreate:
    """Answer the conversation now; ``instructions`` replace the persona for this reply."""

    instructions: str | None = None
    event_id: str | None = None
    text_only: bool | None = None  # output_modalities of this reply (None: the session's)
    tools: tuple[FunctionTool, ...] | None = None  # this reply's (None: the session's)
    tool_choice: ToolChoice | None = None

    def tool_settings(self, session: ToolSettings) -> ToolSettings | None:
        """The tools this reply may call, where it names its own (None: the session's)."""
        if self.tools is None and self.tool_choice is None:
            return None
        return SessionPatch(tools=self.tools, tool_choice=self.tool_choice).apply_tools(session)


@dataclass(frozen=True)
class InputClear:
    event_id: str | None = None


@dataclass(frozen=True)
class OutputClear:
    event_id: str | None = None


@dataclass(frozen=True)
class ItemTruncate:
    """The client played agent item ``item_id`` only up to ``audio_end_ms``."""

    item_id: str
    audio_end_ms: float
    event_id: str | None = None


@dataclass(frozen=True)
class ItemDelete:
    item_id: str
    event_id: str | None = None


@dataclass(frozen=True)
class ItemRetrieve:
    item_id: str
    event_id: str | None = None


@dataclass(frozen=True)
class RealtimeUpdate:
    """A GA ``session.update``."""

    patch: SessionPatch
    event_id: str | None = None


RealtimeEvent = (
    ClientEvent
    | ItemCreate
    | CallOutputCreate
    | CallCreate
    | ToolsUpdate
    | ResponseCreate
    | InputClear
    | OutputClear
    | ItemTruncate
    | ItemDelete
    | ItemRetrieve
    | RealtimeUpdate
)

UNSUPPORTED = {
    "input_audio_buffer.append": "audio comes on the WebRTC track, not in events",
    "input_audio_buffer.commit": "turn detection commits the user's audio on this server",
    "transcription_session.update": "transcription sessions are not supported",
}


def _item_id(value: object, param: str, event_id: str | None) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_QUOTED_CHARS:
        raise ProtocolError(
            "invalid_value",
            f"{param} must be a string of 1 to {MAX_QUOTED_CHARS} characters",
            event_id,
            param,
        )
    return value


def _item(item: object, event_id: str | None) -> ItemCreate | CallOutputCreate | CallCreate:
    """The item of ``conversation.item.create``: a user message, a function call's output, or
    a function call (a client replaying a conversation)."""
    if not isinstance(item, dict):
        raise ProtocolError("invalid_value", "item must be an object", event_id, "item")
    raw_id = item.get("id")
    item_id = None if raw_id is None else _item_id(raw_id, "item.id", event_id)
    kind = item.get("type", "message")
    if kind in ("function_call_output", "function_call"):
        return parse_call_item(item, item_id, event_id)
    if kind != "message":
        message = "items are messages, function calls or function call outputs"
        raise ProtocolError("unsupported_feature", message, event_id, "item.type")
    text = _user_text(item, event_id)
    return ItemCreate(text, item_id, event_id)


def _user_text(item: dict[str, Any], event_id: str | None) -> str:
    """The text of a user message item."""
    if item.get("role") != "user":
        raise ProtocolError(
            "unsupported_feature", "only user messages can be created", event_id, "item.role"
        )
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise ProtocolError(
            "invalid_value", "item.content must be a list", event_id, "item.content"
        )
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "input_text":
            raise ProtocolError(
                "unsupported_feature",
                "a user message holds input_text parts (audio comes on the WebRTC track)",
                event_id,
                "item.content",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise ProtocolError("invalid_value", "text must be a string", event_id, "item.content")
        texts.append(text.strip())
    return checked_text(" ".join(t for t in texts if t), "invalid_value", event_id, "item.content")


def _response(data: dict[str, Any], event_id: str | None) -> ResponseCreate:
    response = data.get("response") or {}
    if not isinstance(response, dict):
        raise ProtocolError("invalid_value", "response must be an object", event_id, "response")
    if response.get("conversation", "auto") != "auto" or response.get("input") is not None:
        raise ProtocolError(
            "unsupported_feature",
            "out-of-band responses (conversation 'none', input) are not supported",
            event_id,
            "response.conversation",
        )
    tools = None
    if response.get("tools") is not None:
        tools = parse_tools(response["tools"], "response.tools", event_id)
    choice = None
    if response.get("tool_choice") is not None:
        choice = parse_tool_choice(response["tool_choice"], tools, "response.tool_choice", event_id)
    text_only = output_modalities(response.get("output_modalities"), "response", event_id)
    instructions = response.get("instructions")
    if instructions is not None and (not isinstance(instructions, str) or not instructions.strip()):
        raise ProtocolError(
            "invalid_value",
            "instructions must be a non-empty string",
            event_id,
            "response.instructions",
        )
    if instructions is not None and len(instructions) > MAX_PERSONA_CHARS:
        raise ProtocolError(  # they replace the persona for this reply: the persona's limit
            "invalid_value",
            f"instructions longer than {MAX_PERSONA_CHARS} characters",
            event_id,
            "response.instructions",
        )
    return ResponseCreate(instructions, event_id, text_only, tools, choice)


def _truncate(data: dict[str, Any], event_id: str | None) -> ItemTruncate:
    item_id = _item_id(data.get("item_id"), "item_id", event_id)
    if data.get("content_index", 0) != 0:
        raise ProtocolError("invalid_value", "content_index must be 0", event_id, "content_index")
    end = milliseconds(data, "audio_end_ms", "invalid_value", event_id)
    return ItemTruncate(item_id, end, event_id)


def _sets_tools(session: dict[str, Any]) -> bool:
    return "tools" in session or "tool_choice" in session


def parse_native_event(raw: str | bytes, max_bytes: int) -> RealtimeEvent:
    """One message of the native dialect (server/wire/protocol.py), with function calling:
    ``session.update`` may set ``tools`` and ``tool_choice`` (GA shapes), and
    ``conversation.item.create`` may add a ``function_call_output`` item, which is answered
    by itself as typed text is."""
    data, event_id, kind = decode_event(raw, max_bytes)
    session = data.get("session")
    if kind == "session.update" and isinstance(session, dict) and _sets_tools(session):
        tools = None
        if session.get("tools") is not None:
            tools = parse_tools(session["tools"], "session.tools", event_id)
        choice = None
        if session.get("tool_choice") is not None:
            where = "session.tool_choice"
            choice = parse_tool_choice(session["tool_choice"], tools, where, event_id)
        rest = {k: v for k, v in session.items() if k not in ("tools", "tool_choice")}
        changes = session_fields({"session": rest}, event_id) if rest else {}
        return ToolsUpdate(tools, choice, changes, event_id)
    item = data.get("item")
    output = isinstance(item, dict) and item.get("type") == "function_call_output"
    if kind == "conversation.item.create" and output:
        assert isinstance(item, dict)
        found = parse_call_item(item, None, event_id)
        assert isinstance(found, CallOutputCreate)
        return replace(found, answer=True)
    return parse_client_event(raw, max_bytes)


def parse_realtime_event(raw: str | bytes, max_bytes: int) -> RealtimeEvent:
    """Parse one message of the GA dialect; ProtocolError (with ``param``) otherwise."""
    data, event_id, kind = decode_event(raw, max_bytes)
    if kind == "session.update":
        if not isinstance(data.get("session"), dict):
            raise ProtocolError("invalid_event", "needs a 'session' object", event_id, "session")
        return RealtimeUpdate(parse_session(data["session"], event_id), event_id)
    if kind == "conversation.item.create":
        return _item(data.get("item"), event_id)
    if kind == "response.create":
        return _response(data, event_id)
    if kind == "response.cancel":
        return ResponseCancel(event_id)
    if kind == "input_audio_buffer.clear":
        return InputClear(event_id)
    if kind == "output_audio_buffer.clear":
        return OutputClear(event_id)
    if kind == "conversation.item.truncate":
        return _truncate(data, event_id)
    if kind == "conversation.item.delete":
        return ItemDelete(_item_id(data.get("item_id"), "item_id", event_id), event_id)
    if kind == "conversation.item.retrieve":
        return ItemRetrieve(_item_id(data.get("item_id"), "item_id", event_id), event_id)
    if kind == EXTENSION_PREFIX + "session.update":
        return SessionUpdate(session_fields(data, event_id), event_id)
    if kind == EXTENSION_PREFIX + "playback.ack":
        return PlaybackAck(milliseconds(data, "played_ms", "invalid_event", event_id), event_id)
    if kind in UNSUPPORTED:
        raise ProtocolError("unsupported_feature", UNSUPPORTED[kind], event_id, "type")
    raise ProtocolError("unknown_event", f"unknown event type {quoted(kind)}", event_id, "type")
