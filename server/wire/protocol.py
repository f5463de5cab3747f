"""The ``events`` data channel: client events parsed and validated into typed values.

Client -> server (JSON objects with a ``type``):
- ``session.update``: ``{"session": {"persona"?, "voice"?, "appearance"?}}``
- ``response.cancel``: stop the reply now, keep what was heard
- ``conversation.item.create``: typed user text, ``{"item": {"type": "message", "role": "user",
  "content": [{"type": "input_text", "text": "..."}]}}`` or the short ``{"text": "..."}``
- ``playback.ack``: ``{"played_ms": <ms of agent audio the client has played>}``
An optional ``event_id`` (string, at most MAX_EVENT_ID_CHARS) is echoed in the ``error`` event
answering a bad event.

Hostile input is one ProtocolError like any other: nesting deeper than server/jsontext.py's
MAX_DEPTH, a key named twice in one object, a text message that was not UTF-8 (handed on
as UndecodableText by the data-channel guard in server/rtc/settings.py). An error message quotes a
client value cut to MAX_QUOTED_CHARS and is at most MAX_ERROR_MESSAGE_CHARS long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from server.errors import RuntimeErrorBase
from server.jsontext import JsonRefused, load_json

MAX_TEXT_CHARS = 2000
MAX_EVENT_ID_CHARS = 64
MAX_QUOTED_CHARS = 64  # of a client value quoted in an error message
MAX_ERROR_MESSAGE_CHARS = 256
ELLIPSIS = "..."


class UndecodableText(bytes):
    """A text (WebRTC String) data-channel message whose bytes are not UTF-8, as received."""


def quoted(value: object) -> str:
    """A client value for an error message: a string's ``repr`` cut to MAX_QUOTED_CHARS
    characters (never echoed at length), any other value's type name."""
    text = repr(value) if isinstance(value, str) else f"<{type(value).__name__}>"
    if len(text) <= MAX_QUOTED_CHARS:
        return text
    return text[: MAX_QUOTED_CHARS - len(ELLIPSIS)] + ELLIPSIS


def _bounded(message: str) -> str:
    if len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message
    return message[: MAX_ERROR_MESSAGE_CHARS - len(ELLIPSIS)] + ELLIPSIS


def error_event(
    kind: str, code: str, message: str, event_id: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An ``error`` event; ``kind`` (``error.type``) says whose fault it was: the client's
    (``invalid_request_error``) or the server's (``server_error``). ``message`` is cut to
    MAX_ERROR_MESSAGE_CHARS, whatever it quotes; ``param``: the field at fault."""
    error: dict[str, Any] = {"type": kind, "code": code, "message": _bounded(message)}
    if event_id is not None:
        error["event_id"] = event_id
    if param is not None:
        error["param"] = param
    return {"type": "error", "error": error}


class ProtocolError(RuntimeErrorBase):
    """A client event that cannot be accepted; nothing was changed."""

    def __init__(
        self, code: str, message: str, event_id: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id
        self.param = param

    def to_event(self) -> dict[str, Any]:
        return error_event(
            "invalid_request_error", self.code, self.message, self.event_id, self.param
        )


@dataclass(frozen=True)
class SessionUpdate:
    changes: dict[str, object]
    event_id: str | None = None


@dataclass(frozen=True)
class ResponseCancel:
    event_id: str | None = None


@dataclass(frozen=True)
class TextInput:
    text: str
    event_id: str | None = None


@dataclass(frozen=True)
class PlaybackAck:
    played_ms: float
    event_id: str | None = None


ClientEvent = SessionUpdate | ResponseCancel | TextInput | PlaybackAck


def milliseconds(data: dict[str, Any], name: str, code: str, event_id: str | None) -> float:
    """The field ``name`` of a client event: a finite number of ms >= 0, or ProtocolError
    (``code``, naming the field)."""
    value = data.get(name)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ProtocolError(code, f"{name} must be a number >= 0", event_id, name)
    return float(value)


def session_fields(data: dict[str, Any], event_id: str | None) -> dict[str, object]:
    """The ``session`` object of a (native) ``session.update``, its field names bounded."""
    session = data.get("session")
    if not isinstance(session, dict):
        raise ProtocolError("invalid_event", "session.update needs a 'session' object", event_id)
    for key in session:  # no field name is this long; the session would quote it in full
        if len(key) > MAX_QUOTED_CHARS:
            raise ProtocolError(
                "invalid_session_update", f"session.update: unknown field {quoted(key)}", event_id
            )
    return dict(session)


def _text_of(data: dict[str, Any], event_id: str | None) -> str:
    if "text" in data:
        text = data["text"]
    else:
        item = data.get("item")
        content = item.get("content") if isinstance(item, dict) else None
        if not (isinstance(content, list) and content and isinstance(content[0], dict)):
            raise ProtocolError(
                "invalid_item", "conversation.item.create needs item.content[0].text", event_id
            )
        if isinstance(item, dict) and item.get("role", "user") != "user":
            raise ProtocolError("invalid_item", "only user items can be created", event_id)
        text = content[0].get("text")
    return checked_text(text, "invalid_item", event_id)


def checked_text(text: object, code: str, event_id: str | None, param: str | None = None) -> str:
    """Typed user text: a non-empty string of at most MAX_TEXT_CHARS (stripped), or
    ProtocolError (``code``, naming ``param``)."""
    if not isinstance(text, str) or not text.strip():
        raise ProtocolError(code, "text must be a non-empty string", event_id, param)
    if len(text) > MAX_TEXT_CHARS:
        raise ProtocolError(code, f"text longer than {MAX_TEXT_CHARS} chars", event_id, param)
    return text.strip()


def decode_event(raw: str | bytes, max_bytes: int) -> tuple[dict[str, Any], str | None, str]:
    """One data-channel message (``max_bytes``: its largest size in bytes) as a JSON object,
    its ``event_id`` and its ``type``; ProtocolError with a code and a clear message, whatever
    the message holds."""
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise ProtocolError("message_too_large", f"event of {size} bytes exceeds {max_bytes}")
    if isinstance(raw, UndecodableText):
        raise ProtocolError("invalid_utf8", "a text message must be valid UTF-8")
    try:
        data = load_json(raw if isinstance(raw, str) else raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ProtocolError("invalid_json", "event is not valid JSON") from None
    except JsonRefused as exc:
        raise ProtocolError("invalid_json", f"event: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_event", "event must be a JSON object")
    event_id = data.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError("invalid_event", "event_id must be a string")
    if event_id is not None and len(event_id) > MAX_EVENT_ID_CHARS:
        raise ProtocolError(
            "invalid_event", f"event_id longer than {MAX_EVENT_ID_CHARS} characters"
        )
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("invalid_event", "event needs a string 'type'", event_id)
    return data, event_id, kind


def parse_client_event(raw: str | bytes, max_bytes: int) -> ClientEvent:
    """Parse one message of the native dialect (see :func:`decode_event`)."""
    data, event_id, kind = decode_event(raw, max_bytes)
    if kind == "session.update":
        return SessionUpdate(session_fields(data, event_id), event_id)
    if kind == "response.cancel":
        return ResponseCancel(event_id)
    if kind == "conversation.item.create":
        return TextInput(_text_of(data, event_id), event_id)
    if kind == "playback.ack":
        return PlaybackAck(milliseconds(data, "played_ms", "invalid_event", event_id), event_id)
    raise ProtocolError("unknown_event", f"unknown event type {quoted(kind)}", event_id)
