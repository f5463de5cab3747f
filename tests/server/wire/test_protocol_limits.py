"""The event parser on hostile input: deep nesting, text that was not UTF-8, long client values
that an error would quote (security issue items 3 and 6). Each is one ProtocolError."""

from __future__ import annotations

import json

import pytest

from server.wire.protocol import ProtocolError, error_event, parse_client_event

MAX_BYTES = 16_384
# the documented limits (server/wire/protocol.py) as numbers: the contract, not constants
MAX_QUOTED_CHARS = 64  # a client value quoted in an error message
MAX_ERROR_MESSAGE_CHARS = 256
MAX_EVENT_ID_CHARS = 64


def refusal(raw: str | bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse_client_event(raw, MAX_BYTES)
    return caught.value


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 1000,
        "[" * 5000 + "]" * 5000,
        '{"type": "playback.ack", "x": ' + '{"a": ' * 2000,
        ('{"a":' * 2000 + "1" + "}" * 2000).encode(),
    ],
    ids=["open-lists", "closed-lists", "open-objects", "binary-objects"],
)
def test_deep_nesting_is_one_protocol_error(raw: str | bytes) -> None:
    error = refusal(raw)
    assert error.code in ("invalid_json", "invalid_event")


def test_nesting_past_the_limit_is_refused_even_when_json_parses_it() -> None:
    nested: object = "leaf"
    for _ in range(40):
        nested = [nested]
    error = refusal(json.dumps({"type": "session.update", "session": {"persona": nested}}))
    assert error.code == "invalid_json"  # measured on the text, before the parser runs
    assert "nested deeper than 32" in error.message


def test_a_key_named_twice_is_refused() -> None:
    """Parsers disagree on which value counts (SECURITY.md, one resume_token)."""
    error = refusal('{"type": "response.create", "type": "session.update"}')
    assert error.code == "invalid_json" and "'type' appears twice" in error.message


def test_text_that_was_not_utf8_is_one_protocol_error() -> None:
    from server.wire.protocol import (
        UndecodableText,  # the form the data-channel guard hands on
    )

    error = refusal(UndecodableText(b'{"type": "\xff\xfe"}'))
    assert error.code == "invalid_utf8"


def test_an_unknown_type_is_quoted_short() -> None:
    kind = "x" * 16_000
    error = refusal(json.dumps({"type": kind}))
    assert error.code == "unknown_event"
    assert "x" * (MAX_QUOTED_CHARS + 1) not in error.message
    assert len(error.message) <= MAX_ERROR_MESSAGE_CHARS


def test_a_long_event_id_is_refused_and_not_echoed() -> None:
    event_id = "i" * 10_000
    error = refusal(json.dumps({"type": "response.cancel", "event_id": event_id}))
    assert error.code == "invalid_event"
    assert error.event_id is None
    assert "i" * (MAX_QUOTED_CHARS + 1) not in json.dumps(error.to_event())
    ok = parse_client_event(json.dumps({"type": "response.cancel", "event_id": "i" * 64}), 999)
    assert ok.event_id == "i" * MAX_EVENT_ID_CHARS


def test_every_error_message_is_bounded() -> None:
    event = error_event("invalid_request_error", "x", "m" * 50_000, "e" * 10)
    assert len(event["error"]["message"]) <= MAX_ERROR_MESSAGE_CHARS
    assert event["error"]["message"].endswith("...")
