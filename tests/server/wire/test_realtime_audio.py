"""The WebSocket's audio events (server/wire/realtime_audio.py) and the pause of a reply as a
client that plays the audio itself hears it (server/wire/realtime_wire.py): values only."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from server.wire.protocol import ProtocolError
from server.wire.realtime_audio import (
    MAX_APPEND_BYTES,
    AudioAppend,
    AudioCommit,
    ReplyAudio,
    audio_delta,
    check_formats,
    parse_audio_event,
)
from server.wire.realtime_wire import RealtimeWire

SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
PAUSED = {
    "type": "output_audio_buffer.paused",
    "epoch": 0,
    "response_id": "resp_0001",
    "item_id": "item_0002",
    "audio_end_ms": 640.0,
    "position_ms": 5120.0,
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_an_append_is_pcm16_at_24_khz_within_its_bound() -> None:
    pcm = np.array([0, 1, -1, 32767, -32768], np.int16)
    event = parse_audio_event({"audio": b64(pcm.astype("<i2").tobytes())}, "e1", APPEND)
    assert isinstance(event, AudioAppend)
    assert event.pcm.tolist() == pcm.tolist() and event.event_id == "e1"
    assert event.duration_ms == pytest.approx(5 / 24)
    assert isinstance(parse_audio_event({}, None, "input_audio_buffer.commit"), AudioCommit)
    assert parse_audio_event({}, None, "response.create") is None
    bad: list[dict[str, Any]] = [
        {"audio": "not base64!"},
        {"audio": b64(bytes(3))},
        {"audio": 7},
        {},
    ]
    bad.append({"audio": b64(bytes(MAX_APPEND_BYTES + 2))})
    for data in bad:
        with pytest.raises(ProtocolError) as refused:
            parse_audio_event(data, "e2", APPEND)
        assert refused.value.param == "audio" and refused.value.event_id == "e2"
    assert parse_audio_event({"audio": b64(bytes(MAX_APPEND_BYTES))}, None, APPEND) is not None


APPEND = "input_audio_buffer.append"


def test_formats_other_than_pcm16_at_24_khz_are_refused() -> None:
    pcm = {"type": "audio/pcm", "rate": 24_000}
    check_formats({"session": {"audio": {"input": {"format": pcm}, "output": {}}}}, None)
    check_formats({"session": {"instructions": "Be brief."}}, None)
    for fmt in ({"type": "audio/pcmu"}, {"type": "audio/pcm", "rate": 16_000}, "pcm16"):
        with pytest.raises(ProtocolError) as refused:
            check_formats({"session": {"audio": {"output": {"format": fmt}}}}, None)
        assert refused.value.code == "unsupported_feature"


def test_a_delta_is_a_valid_ga_event() -> None:
    delta = audio_delta(ReplyAudio("resp_0001", "item_0002"), np.arange(4, dtype=np.int16))
    assert (
        SERVER_EVENT.validate_python({**delta, "event_id": "audio_000001"}).item_id == "item_0002"
    )
    assert base64.b64decode(delta["delta"]) == np.arange(4, dtype="<i2").tobytes()


def test_a_pause_says_speech_started_only_where_the_client_plays_the_audio() -> None:
    wire = RealtimeWire(lambda: {}, lambda: "joe")
    assert [e["type"] for e in wire.translate(PAUSED)] == ["x-avatar.output_audio_buffer.paused"]
    wire.input_ms = lambda: 3960.4
    started, paused = wire.translate(PAUSED)
    assert started == {
        "type": "input_audio_buffer.speech_started",
        "item_id": "",
        "audio_start_ms": 3960,
    }
    assert SERVER_EVENT.validate_python({**started, "event_id": "event_00001"})
    assert paused["type"] == "x-avatar.output_audio_buffer.paused"
    assert paused["audio_end_ms"] == 640.0
    resumed = {**PAUSED, "type": "output_audio_buffer.resumed", "paused_ms": 400.0, "reason": "x"}
    del resumed["position_ms"]
    assert [e["type"] for e in wire.translate(resumed)] == ["x-avatar.output_audio_buffer.resumed"]
