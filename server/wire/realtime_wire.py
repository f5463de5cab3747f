"""The ``oai-events`` dialect: a conversation's events in the OpenAI Realtime GA names and
shapes, plus this server's own events under ``x-avatar.*`` names.

The conversation makes its events once, in the native dialect (the ``events`` channel: beta
names, this server's shapes, the ids of items and responses inside). A :class:`RealtimeWire`
turns each into the GA events that say the same, in order, keeping what GA needs that one
native event does not carry (the items announced, a response's text so far, event ids).

Native -> GA: ``session.created`` -> ``session.created`` + ``x-avatar.session`` (the native
body: resume token, appearances); ``input_audio_buffer.committed`` -> the same +
``conversation.item.added``; a transcription's ``completed`` -> the same +
``conversation.item.done``; the first ``response.audio_transcript.delta`` of a response ->
``response.output_item.added``, ``conversation.item.added``, ``response.content_part.added``,
then every one -> ``response.output_audio_transcript.delta``; ``response.done`` -> the
``.done`` events of the transcript, audio, part and item, then ``response.done`` with the item
as heard; ``response.function_call_arguments.done`` (a call the reply made) -> the call's
item added, its arguments' delta and ``.done``, the item done, and the item in the output of
``response.done``. Extensions: ``avatar.viseme``, ``response.timings``, ``vision.presence``,
``input_audio_buffer.barge_in``, ``avatar.tool`` (the avatar's own tool ran), the native
``session.updated`` (conditions applied at a chunk boundary) and the whole partial transcript
become ``x-avatar.viseme``, ``x-avatar.response.timings``, ``x-avatar.vision.presence``,
``x-avatar.barge_in``, ``x-avatar.tool``, ``x-avatar.session.applied`` and
``x-avatar.transcription.partial``.

A client that plays the reply itself (the WebSocket of ``GET /v1/realtime``: ``input_ms`` set)
must stop its playback when the server pauses the reply for voice over it, not only once the
voice is judged an interruption: there ``output_audio_buffer.paused`` also says
``input_audio_buffer.speech_started`` (``item_id`` empty: the voice is no item yet), before
``x-avatar.output_audio_buffer.paused``; ``x-avatar.output_audio_buffer.resumed`` says the
reply plays on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EXTENSION_PREFIX = "x-avatar."
EXTENSIONS = {
    "avatar.viseme": "x-avatar.viseme",
    "avatar.tool": "x-avatar.tool",
    "response.timings": "x-avatar.response.timings",
    "vision.presence": "x-avatar.vision.presence",
    "input_audio_buffer.barge_in": "x-avatar.barge_in",
    "session.updated": "x-avatar.session.applied",
}
SAME_NAME = (  # native events whose GA twin has the same name and fields (plus event_id)
    "input_audio_buffer.cleared",
    "conversation.item.deleted",
)
Event = dict[str, Any]
TRANSCRIPT_DELTA = "response.output_audio_transcript.delta"
TRANSCRIPT_DONE = "response.output_audio_transcript.done"
MAX_KEPT = 16  # user items and epochs remembered (a long conversation stays bounded)


@dataclass
class _Reply:
    """What the wire knows of one response."""

    response_id: str
    item_id: str
    previous_item_id: str | None
    text_only: bool = False  # a text reply (output_text events), not speech
    text: str = ""  # generated so far
    announced: bool = False  # its item was added
    calls: list[Event] = field(default_factory=list)  # its function_call items, in order

    @property
    def part(self) -> str:
        """Its content part's type: ``text`` or ``audio``."""
        return "text" if self.text_only else "audio"

    def content(self, text: str) -> Event:
        """Its content part as an item holds it, with ``text``."""
        if self.text_only:
            return {"type": "output_text", "text": text}
        return {"type": "output_audio", "transcript": text}


@dataclass
class _UserItem:
    started_ms: float = 0.0
    stopped_ms: float = 0.0
    stable: str = ""  # partial words already sent as GA deltas


@dataclass
class RealtimeWire:
    """Native events in, GA events out, for one conversation (``session_view``: the GA
    session object as it stands; ``voice``: the voice in force)."""

    session_view: Callable[[], Event]
    voice: Callable[[], str]
    # the input timeline's position (ms) where the client plays the reply itself; None: the
    # server plays it (WebRTC), a pause is the server's own affair
    input_ms: Callable[[], float] | None = None
    _user: dict[str, _UserItem] = field(default_factory=dict)
    _current_user: str | None = None
    _replies: dict[str, _Reply] = field(default_factory=dict)
    _epochs: dict[int, str] = field(default_factory=dict)  # epoch -> its latest response id
    _last_item: str | None = None

    def translate(self, event: Event) -> list[Event]:
        """The GA events for one native event (the outlet gives each its ``event_id``)."""
        kind = str(event.get("type"))
        handler = HANDLERS.get(kind)
        if kind in SAME_NAME:
            out = [dict(event)]
        elif handler is not None:
            out = handler(self, event)
        else:
            body = _body(event)
            out = [{"type": EXTENSIONS.get(kind, EXTENSION_PREFIX + kind), **body}]
        return out

    # --- session --------------------------------------------------------------------------
    def _session_created(self, event: Event) -> list[Event]:
        native = _body(event)
        return [
            {"type": "session.created", "session": self.session_view()},
            {"type": EXTENSION_PREFIX + "session", **native},
        ]

    def _session_configured(self, event: Event) -> list[Event]:
        return [{"type": "session.updated", "session": self.session_view()}]

    def _error(self, event: Event) -> list[Event]:
        error = {"param": None, "event_id": None, **event.get("error", {})}
        extra = {k: v for k, v in event.items() if k not in ("type", "error")}
        return [{"type": "error", "error": error, **extra}]

    # --- the user's items ---------------------------------------------------------------------
    def _input_audio_buffer_speech_started(self, event: Event) -> list[Event]:
        item_id = str(event.get("item_id", ""))
        self._current_user = item_id
        self._user[item_id] = _UserItem(started_ms=float(event["audio_start_ms"]))
        while len(self._user) > MAX_KEPT:
            del self._user[next(iter(self._user))]
        start = round(event["audio_start_ms"])
        return [{"type": event["type"], "audio_start_ms": start, "item_id": item_id}]

    def _input_audio_buffer_speech_stopped(self, event: Event) -> list[Event]:
        item_id = str(event.get("item_id", ""))
        self._user.setdefault(item_id, _UserItem()).stopped_ms = float(event["audio_end_ms"])
        end = round(event["audio_end_ms"])
        return [{"type": event["type"], "audio_end_ms": end, "item_id": item_id}]

    def _input_audio_buffer_committed(self, event: Event) -> list[Event]:
        item_id, previous = event["item_id"], event.get("previous_item_id")
        item = _message(
            item_id, "user", "in_progress", [{"type": "input_audio", "transcript": None}]
        )
        self._last_item = item_id
        return [
            {"type": event["type"], "item_id": item_id, "previous_item_id": previous},
            {"type": "conversation.item.added", "previous_item_id": previous, "item": item},
        ]

    def _conversation_item_created(self, event: Event) -> list[Event]:
        item_id, previous = event["item_id"], event.get("previous_item_id")
        if event.get("item_type") == "function_call_output":
            item = _call_output(item_id, str(event["call_id"]), str(event.get("output", "")))
        elif event.get("item_type") == "function_call":
            call = (str(event["call_id"]), str(event["name"]), str(event.get("arguments", "")))
            item = _call(item_id, *call, "completed")
        else:
            content = [{"type": "input_text", "text": event["text"]}]
            item = _message(item_id, "user", "completed", content)
        self._last_item = item_id
        return [
            {"type": "conversation.item.added", "previous_item_id": previous, "item": item},
            {"type": "conversation.item.done", "previous_item_id": previous, "item": item},
        ]

    def _conversation_item_input_audio_transcription_delta(self, event: Event) -> list[Event]:
        item_id = self._current_user or ""
        user = self._user.setdefault(item_id, _UserItem())
        out: list[Event] = []
        stable = str(event.get("stable", ""))
        if stable.startswith(user.stable) and len(stable) > len(user.stable):
            delta, user.stable = stable[len(user.stable) :], stable
            out.append(
                {"type": event["type"], "item_id": item_id, "content_index": 0, "delta": delta}
            )
        partial = {"item_id": item_id, "transcript": event.get("transcript", ""), "stable": stable}
        out.append({"type": EXTENSION_PREFIX + "transcription.partial", **partial})
        return out

    def _conversation_item_input_audio_transcription_completed(self, event: Event) -> list[Event]:
        item_id = str(event.get("item_id") or self._current_user or "")
        user = self._user.pop(item_id, _UserItem())
        seconds = max(0.0, user.stopped_ms - user.started_ms) / 1000
        transcript = event["transcript"]
        content = [{"type": "input_audio", "transcript": transcript}]
        item = _message(item_id, "user", "completed", content)
        return [
            {
                "type": event["type"],
                "item_id": item_id,
                "content_index": 0,
                "transcript": transcript,
                "usage": {"type": "duration", "seconds": round(seconds, 3)},
            },
            {"type": "conversation.item.done", "previous_item_id": None, "item": item},
        ]

    # --- responses ------------------------------------------------------------------------------
    def _response_created(self, event: Event) -> list[Event]:
        text_only = event.get("output") == "text"
        reply = _Reply(event["response_id"], event["item_id"], self._last_item, text_only)
        self._replies[reply.response_id] = reply
        self._epochs[int(event["epoch"])] = reply.response_id
        while len(self._epochs) > MAX_KEPT:
            del self._epochs[next(iter(self._epochs))]
        return [{"type": "response.created", "response": self._response(reply, "in_progress", [])}]

    def _response_audio_transcript_delta(self, event: Event) -> list[Event]:
        reply = self._replies.get(str(event.get("response_id")))
        if reply is None:
            return []
        out: list[Event] = []
        ids = {"response_id": reply.response_id, "item_id": reply.item_id, "output_index": 0}
        if not reply.announced:
            reply.announced = True
            self._last_item = reply.item_id
            item = _message(reply.item_id, "assistant", "in_progress", [])
            part = {**reply.content(""), "type": reply.part}
            out += [
                {
                    "type": "response.output_item.added",
                    "response_id": reply.response_id,
                    "output_index": 0,
                    "item": item,
                },
                {
                    "type": "conversation.item.added",
                    "previous_item_id": reply.previous_item_id,
                    "item": item,
                },
                {"type": "response.content_part.added", **ids, "content_index": 0, "part": part},
            ]
        delta = str(event["delta"])
        delta = f" {delta}" if reply.text else delta
        reply.text += delta
        kind = "response.output_text.delta" if reply.text_only else TRANSCRIPT_DELTA
        out.append({"type": kind, **ids, "content_index": 0, "delta": delta})
        return out

    def _response_function_call_arguments_done(self, event: Event) -> list[Event]:
        """A call the response made: its item added, its arguments (in one delta: they were
        checked whole against the tool's schema before any went out), the item done."""
        reply = self._replies.get(str(event.get("response_id")))
        if reply is None:
            return []
        item_id, call_id = str(event["item_id"]), str(event["call_id"])
        name, arguments = str(event["name"]), str(event["arguments"])
        index = int(reply.announced) + len(reply.calls)
        ids = {"response_id": reply.response_id, "item_id": item_id, "output_index": index}
        previous = self._last_item
        self._last_item = item_id
        added = _call(item_id, call_id, name, "", "in_progress")
        done = _call(item_id, call_id, name, arguments, "completed")
        reply.calls.append(done)
        at = {"response_id": reply.response_id, "output_index": index}
        delta = {"call_id": call_id, "delta": arguments}
        whole = {"call_id": call_id, "name": name, "arguments": arguments}
        return [
            {"type": "response.output_item.added", **at, "item": added},
            {"type": "conversation.item.added", "previous_item_id": previous, "item": added},
            {"type": "response.function_call_arguments.delta", **ids, **delta},
            {"type": "response.function_call_arguments.done", **ids, **whole},
            {"type": "response.output_item.done", **at, "item": done},
            {"type": "conversation.item.done", "previous_item_id": previous, "item": done},
        ]

    def _output_audio_paused(self, event: Event) -> list[Event]:
        """Voice over the reply paused it: an extension event, and where the client plays the
        reply itself ``input_audio_buffer.speech_started`` first (it stops its playback)."""
        paused = [{"type": EXTENSION_PREFIX + str(event["type"]), **_body(event)}]
        if self.input_ms is None:
            return paused
        start = {"type": "input_audio_buffer.speech_started", "item_id": ""}
        return [{**start, "audio_start_ms": round(self.input_ms())}, *paused]

    def _output_audio_buffer(self, event: Event) -> list[Event]:
        return [{"type": event["type"], "response_id": event["response_id"]}]

    def _conversation_item_truncated(self, event: Event) -> list[Event]:
        end = round(float(event.get("item_audio_end_ms") or event["audio_end_ms"]))
        return [
            {
                "type": event["type"],
                "item_id": event.get("item_id", ""),
                "content_index": 0,
                "audio_end_ms": end,
            }
        ]

    def _conversation_item_retrieved(self, event: Event) -> list[Event]:
        """The item as the conversation holds it: a spoken user message with its transcript,
        a typed one with its text, an agent's with the transcript of what was heard."""
        text, role = str(event.get("text", "")), str(event.get("role", ""))
        item_id = str(event.get("item_id", ""))
        if event.get("name"):
            call = (str(event["call_id"]), str(event["name"]), str(event.get("arguments", "")))
            return [{"type": event["type"], "item": _call(item_id, *call, "completed")}]
        if role == "tool":
            output = _call_output(item_id, str(event.get("call_id", "")), text)
            return [{"type": event["type"], "item": output}]
        content: list[Event]
        if role == "assistant":
            content = [{"type": "output_audio", "transcript": text}]
            status = "incomplete" if event.get("truncated") else "completed"
        elif event.get("typed"):
            content, status = [{"type": "input_text", "text": text}], "completed"
        else:
            content, status = [{"type": "input_audio", "transcript": text}], "completed"
        item = _message(item_id, role, status, content)
        return [{"type": event["type"], "item": item}]

    def _response_done(self, event: Event) -> list[Event]:
        reply = self._replies.pop(str(event.get("response_id")), None)
        if reply is None:  # a turn that failed before its response began
            reply = _Reply(
                str(event.get("response_id") or f"resp_epoch_{event['epoch']}"), "", None
            )
        status = str(event["status"])
        out: list[Event] = []
        output: list[Event] = []
        if reply.announced:
            heard = str(event.get("transcript", ""))
            ids = {"response_id": reply.response_id, "item_id": reply.item_id, "output_index": 0}
            content = reply.content(heard)
            part = {**content, "type": reply.part}
            item_status = "completed" if status == "completed" else "incomplete"
            item = _message(reply.item_id, "assistant", item_status, [content])
            output = [item]
            if reply.text_only:
                text_done = {"type": "response.output_text.done", "text": reply.text}
                out.append({**text_done, **ids, "content_index": 0})
            else:
                transcript_done = {"type": TRANSCRIPT_DONE, "transcript": reply.text}
                out.append({**transcript_done, **ids, "content_index": 0})
                out.append({"type": "response.output_audio.done", **ids, "content_index": 0})
            out += [
                {"type": "response.content_part.done", **ids, "content_index": 0, "part": part},
                {
                    "type": "response.output_item.done",
                    "response_id": reply.response_id,
                    "output_index": 0,
                    "item": item,
                },
                {
                    "type": "conversation.item.done",
                    "previous_item_id": reply.previous_item_id,
                    "item": item,
                },
            ]
        response = self._response(reply, status, [*output, *reply.calls])
        if status == "cancelled":
            response["status_details"] = {"type": "cancelled", "reason": "turn_detected"}
        elif status == "failed":
            response["status_details"] = {"type": "failed", "error": None}
        out.append({"type": "response.done", "response": response})
        return out

    def _response(self, reply: _Reply, status: str, output: list[Event]) -> Event:
        return {
            "id": reply.response_id,
            "object": "realtime.response",
            "status": status,
            "output": output,
            "output_modalities": [reply.part],
            "audio": {"output": {"voice": self.voice()}},
            "conversation_id": None,
            "metadata": None,
            "usage": None,
        }

    def _of_response(self, event: Event) -> list[Event]:
        """An extension event of a response (timings, visemes), with its ``response_id``."""
        body = _body(event)
        response_id = self._epochs.get(int(event.get("epoch", -1)))
        kind = str(event["type"])
        return [{"type": EXTENSIONS[kind], "response_id": response_id, **body}]


def _body(event: Event) -> Event:
    """A native event's fields without its ``type``."""
    return {k: v for k, v in event.items() if k != "type"}


def _call(item_id: str, call_id: str, name: str, arguments: str, status: str) -> Event:
    """A ``function_call`` item."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def _call_output(item_id: str, call_id: str, output: str) -> Event:
    """A ``function_call_output`` item."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call_output",
        "status": "completed",
        "call_id": call_id,
        "output": output,
    }


def _message(item_id: str, role: str, status: str, content: list[Event]) -> Event:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": status,
        "content": content,
    }


HANDLERS: dict[str, Callable[[RealtimeWire, Event], list[Event]]] = {
    "session.created": RealtimeWire._session_created,
    "realtime.session.configured": RealtimeWire._session_configured,
    "error": RealtimeWire._error,
    "input_audio_buffer.speech_started": RealtimeWire._input_audio_buffer_speech_started,
    "input_audio_buffer.speech_stopped": RealtimeWire._input_audio_buffer_speech_stopped,
    "input_audio_buffer.committed": RealtimeWire._input_audio_buffer_committed,
    "conversation.item.created": RealtimeWire._conversation_item_created,
    "conversation.item.input_audio_transcription.delta": (
        RealtimeWire._conversation_item_input_audio_transcription_delta
    ),
    "conversation.item.input_audio_transcription.completed": (
        RealtimeWire._conversation_item_input_audio_transcription_completed
    ),
    "response.created": RealtimeWire._response_created,
    "response.audio_transcript.delta": RealtimeWire._response_audio_transcript_delta,
    "output_audio_buffer.started": RealtimeWire._output_audio_buffer,
    "output_audio_buffer.stopped": RealtimeWire._output_audio_buffer,
    "output_audio_buffer.cleared": RealtimeWire._output_audio_buffer,
    "output_audio_buffer.paused": RealtimeWire._output_audio_paused,
    "conversation.item.truncated": RealtimeWire._conversation_item_truncated,
    "conversation.item.retrieved": RealtimeWire._conversation_item_retrieved,
    "response.done": RealtimeWire._response_done,
    "response.function_call_arguments.done": RealtimeWire._response_function_call_arguments_done,
    "response.timings": RealtimeWire._of_response,
    "avatar.viseme": RealtimeWire._of_response,
}
