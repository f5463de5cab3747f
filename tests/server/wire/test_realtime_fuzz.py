"""Fuzz of the ``oai-events`` client events: Hypothesis draws GA event types (and unknown ones)
with arbitrary fields. The parser either returns a typed event or raises ProtocolError whose
message is bounded and quotes no client value at length; never anything else. Through a
conversation (6 x 20 events), each refused event is answered by exactly one GA ``error``
that validates against the ``openai`` package, and the conversation still answers afterwards."""

from __future__ import annotations

import asyncio
import json
import string
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.conversation.conversation import Conversation
from server.runtime.media import FRAME_SAMPLES
from server.wire.protocol import MAX_ERROR_MESSAGE_CHARS, ProtocolError
from server.wire.realtime_client import parse_realtime_event
from tests.server.wire.test_realtime_dialect import (
    open_talk,
    send,
    until,
    user_message,
    validate,
)
from tests.support.tone_pipeline import InstructedTonePipeline

TYPES = (
    "session.update",
    "conversation.item.create",
    "conversation.item.truncate",
    "conversation.item.delete",
    "conversation.item.retrieve",
    "response.create",
    "response.cancel",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "output_audio_buffer.clear",
    "x-avatar.session.update",
    "x-avatar.playback.ack",
    "transcription_session.update",
)
FIELDS = (
    "session",
    "item",
    "item_id",
    "audio_end_ms",
    "content_index",
    "response",
    "played_ms",
    "audio",
    "instructions",
    "output_modalities",
    "tools",
    "turn_detection",
    "type",
    "role",
    "content",
    "text",
    "voice",
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=14,
)
events = st.builds(
    lambda kind, body, event_id: {
        **body,
        "type": kind,
        **({} if event_id is None else {"event_id": event_id}),
    },
    st.sampled_from(TYPES) | st.text(string.printable, max_size=90),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5),
    st.none() | st.text(string.ascii_letters, min_size=1, max_size=12),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events)
def test_the_parser_returns_a_typed_event_or_one_clear_error(event: dict[str, Any]) -> None:
    raw = json.dumps(event)
    try:
        parse_realtime_event(raw, 16_384)
    except ProtocolError as exc:
        error = exc.to_event()["error"]
        assert error["type"] == "invalid_request_error" and error["code"]
        assert 0 < len(error["message"]) <= MAX_ERROR_MESSAGE_CHARS
        for value in (v for v in event.values() if isinstance(v, str) and len(v) > 70):
            assert value not in error["message"]  # a long client value is never echoed whole


async def handled(conversation: Conversation) -> None:
    """Until the client events received so far were acted on (bounded), audio pulled as a
    peer's track would."""
    for _ in range(200):
        conversation.pull_audio(FRAME_SAMPLES)
        await asyncio.sleep(0)
        if conversation.inbox.idle:
            return
    raise AssertionError("client events still waiting after 200 loop turns")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, min_size=20, max_size=20))
def test_refused_events_get_one_ga_error_each_and_the_session_goes_on(
    drawn: list[dict[str, Any]],
) -> None:
    asyncio.run(talk_through(drawn))


async def talk_through(drawn: list[dict[str, Any]]) -> None:
    """``drawn`` through one conversation, one at a time, then a typed exchange."""
    conversation, link = open_talk({}, InstructedTonePipeline(100.0, 1))
    max_bytes = conversation.config.transport.max_event_bytes
    try:
        for event in drawn:
            raw = json.dumps(event)
            try:
                parsed = parse_realtime_event(raw, max_bytes)
            except ProtocolError:
                parsed = None
            n = len(link.of("error"))
            conversation.receive(raw)
            await handled(conversation)
            if parsed is None:
                assert len(link.of("error")) == n + 1, event
        validate(link.sent)
        # still answering: a cancel of whatever runs, an item, a response
        send(conversation, {"type": "response.cancel"})
        send(conversation, {"type": "input_audio_buffer.clear"})
        send(conversation, user_message("still there?"))
        await handled(conversation)
        n, after = len(link.of("response.done")), len(link.sent)
        send(conversation, {"type": "response.create"})
        await until(link, "response.done", after=after, conversation=conversation)
        assert link.of("response.done")[-1]["response"]["status"] == "completed"
        assert len(link.of("response.done")) == n + 1
    finally:
        await conversation.close()
