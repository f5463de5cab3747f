"""Fuzz of the ``events`` data channel through a real peer.

Hypothesis draws bad client events: text that is not JSON, JSON that is not an object, objects
without a string ``type``, unknown types, known types with bad fields (``session.update`` with
unknown keys or bad values, ``conversation.item.create`` without usable text, ``playback.ack``
without a number >= 0, a non-string ``event_id``), a ``response.cancel`` with nothing to
cancel, binary frames and messages over ``transport.max_event_bytes``; and hostile ones: arrays
and objects nested past the parser's limit (up to thousands deep), text messages that are not
UTF-8 (sent below aiortc's API), unknown types and ``event_id`` values of up to 15,000
characters. Each one must be answered by exactly one ``error`` event, whose message quotes no
client value at length, and change nothing; then a burst of them all at once; then the session
must still take a valid update and answer a typed turn.
"""

from __future__ import annotations

import asyncio
import json
import string
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.cli import ClientPeer
from server.rtc.settings import pin_host_addresses
from tests.support.hostile_peers import send_raw_text
from tests.support.loop_thread import LoopThread
from tests.support.pace import within
from tests.support.peers import Peer
from tests.support.server_process import TONE_PIPELINE, ServerProcess, server_process, tone_env

EVENTS = 400  # one at a time, each waits for its error
BURST = 300  # then sent back to back
MAX_EVENT_BYTES = 16_384
MAX_TEXT_CHARS = 2000
KNOWN = ("session.update", "response.cancel", "conversation.item.create", "playback.ack")
UPDATABLE = ("persona", "voice", "appearance")
ERROR_WAIT_S = 10.0
BURST_WAIT_S = 30.0
MAX_ERROR_MESSAGE_CHARS = 256  # the documented bound on error.message
MAX_QUOTED_CHARS = 64  # the documented bound on a client value quoted in it


class RawText(bytes):
    """Bytes sent as a text message (PPID 51) without encoding: not valid UTF-8."""


Message = str | bytes

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)
non_objects = json_values.filter(lambda v: not isinstance(v, dict))
non_strings = json_values.filter(lambda v: not isinstance(v, str))
blank = st.text(" \t\n\r", max_size=5)
too_long = st.integers(MAX_TEXT_CHARS + 1, MAX_TEXT_CHARS + 50).map(lambda n: "a" * n)
bad_text = non_strings | blank | too_long
event_ids = st.none() | st.text(string.ascii_letters + string.digits, min_size=1, max_size=12)


def with_id(event: dict[str, Any], event_id: str | None) -> dict[str, Any]:
    return event if event_id is None else {**event, "event_id": event_id}


def bad_session_updates() -> st.SearchStrategy[dict[str, Any]]:
    unknown_key = st.text(max_size=12).filter(lambda k: k not in UPDATABLE)
    bad_value = non_strings | blank | st.integers(65, 100).map(lambda n: "v" * n)
    session = st.one_of(
        non_objects,
        st.just({}),
        st.dictionaries(unknown_key, json_values, min_size=1, max_size=3),
        st.builds(lambda k, v: {k: v}, st.sampled_from(["voice", "appearance"]), bad_value),
        st.builds(lambda v: {"persona": v}, non_strings | blank),
    )
    return st.builds(lambda s: {"type": "session.update", "session": s}, session) | st.just(
        {"type": "session.update"}
    )


def bad_items() -> st.SearchStrategy[dict[str, Any]]:
    good_content = [{"type": "input_text", "text": "hello"}]
    item = st.one_of(
        non_objects,
        st.fixed_dictionaries({"content": st.sampled_from([None, False, 0, "", [], "x", 5])}),
        st.fixed_dictionaries({"content": st.lists(json_scalars, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"content": st.just([{"type": "input_text"}])}),
        st.builds(lambda t: {"content": [{"type": "input_text", "text": t}]}, bad_text),
        st.builds(
            lambda role: {"role": role, "content": good_content},
            json_values.filter(lambda r: r != "user"),
        ),
    )
    return st.one_of(
        st.builds(lambda t: {"type": "conversation.item.create", "text": t}, bad_text),
        st.builds(lambda i: {"type": "conversation.item.create", "item": i}, item),
    )


def bad_acks() -> st.SearchStrategy[dict[str, Any]]:
    negative = st.integers(max_value=-1) | st.floats(max_value=-1e-9, allow_infinity=False)
    played = negative | st.booleans() | st.none() | st.text(max_size=10) | st.lists(json_scalars)
    return st.builds(lambda p: {"type": "playback.ack", "played_ms": p}, played) | st.just(
        {"type": "playback.ack"}
    )


def bad_objects() -> st.SearchStrategy[dict[str, Any]]:
    """Known types with bad fields or nothing to do, unknown types (weighted 3:1), objects
    without a string type, and events with a non-string ``event_id``."""
    unknown_type = st.text(max_size=30).filter(lambda t: t not in KNOWN)
    typed = st.one_of(
        bad_session_updates(),
        bad_items(),
        bad_acks(),
        st.just({"type": "response.cancel"}),  # nothing to cancel
        st.builds(lambda t: {"type": t}, unknown_type),
    )
    untyped = st.builds(lambda t: {"type": t}, non_strings) | st.dictionaries(
        st.text(max_size=8).filter(lambda k: k != "type"), json_values
    )
    with_ids = st.builds(with_id, typed, event_ids)
    bad_ids = st.builds(
        lambda e, i: {**e, "event_id": i}, typed, non_strings.filter(lambda v: v is not None)
    )
    return st.one_of(with_ids, with_ids, with_ids, st.builds(with_id, untyped, event_ids), bad_ids)


def not_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def not_json_objects(text: str) -> bool:
    try:
        return not isinstance(json.loads(text), dict)
    except ValueError:
        return True


bad_messages: st.SearchStrategy[Message] = st.one_of(
    bad_objects().map(json.dumps),
    bad_objects().map(json.dumps),
    bad_objects().map(json.dumps),
    non_objects.map(json.dumps),
    st.text(max_size=200).filter(not_json_objects),
    st.binary(min_size=1, max_size=200).filter(lambda b: not_json_objects(b.decode("latin-1"))),
    bad_objects().map(lambda e: json.dumps(e).encode()),
    st.integers(MAX_EVENT_BYTES + 1, 3 * MAX_EVENT_BYTES).map(lambda n: '{"type": "' + "x" * n),
    st.integers(33, 6000).map(lambda n: "[" * n),
    st.integers(33, 2500).map(lambda n: '{"type": "playback.ack", "x": ' + "[" * n + "]" * n + "}"),
    st.integers(33, 2000).map(lambda n: '{"a": ' * n),
    st.integers(MAX_QUOTED_CHARS + 1, 15_000).map(lambda n: json.dumps({"type": "u" * n})),
    st.integers(MAX_QUOTED_CHARS + 1, 15_000).map(
        lambda n: json.dumps({"type": "response.cancel", "event_id": "i" * n})
    ),
    st.integers(MAX_QUOTED_CHARS + 1, 15_000).map(
        lambda n: json.dumps({"type": "session.update", "session": {"k" * n: "v"}})
    ),
    st.binary(min_size=1, max_size=200).filter(not_utf8).map(RawText),
)


async def send(client: ClientPeer, message: Message) -> None:
    """A message as the fuzz drew it: text, binary, or raw bytes sent as text."""
    if isinstance(message, RawText):
        await send_raw_text(client, bytes(message))
    else:
        client.channel.send(message)


# no events budget (session.max_events_per_s 0): the fuzz sends faster than a client may, to
# see each message parsed and answered (the budget: tests/server/rtc/test_session_budget_e2e.py)
server = server_process(
    {"transport.max_sessions": "2", "session.max_events_per_s": "0"},
    pipeline=TONE_PIPELINE,
    env=tone_env(500, sentences=1),
)


@pytest.fixture(scope="module")
def peer(server: ServerProcess) -> Iterator[tuple[LoopThread, ClientPeer]]:
    pin_host_addresses(["127.0.0.1"])
    with LoopThread() as loop:

        async def connect() -> ClientPeer:
            client = Peer(server.url, video=False)
            await client.connect()
            await client.wait_event("session.created")
            return client

        client = loop.run(connect(), 30)
        yield loop, client
        loop.run(client.close(), 30)


def assert_error_event(event: dict[str, Any]) -> str:
    """An ``error`` event of the documented shape; returns its code."""
    error = event["error"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert len(error["message"]) <= MAX_ERROR_MESSAGE_CHARS
    for value in ("u", "i", "k", "x"):  # the long client values drawn above
        assert value * (MAX_QUOTED_CHARS + 1) not in json.dumps(event)
    return str(error["code"])


async def wait_errors(client: ClientPeer, count: int, after: int) -> list[dict[str, Any]]:
    """The events from index ``after`` on, once ``count`` of them are errors (or time is up)."""
    deadline = time.monotonic() + within(BURST_WAIT_S)
    while True:
        events = [e for _, e in client.events[after:]]
        errors = sum(e.get("type") == "error" for e in events)
        if errors >= count or time.monotonic() > deadline:
            await asyncio.sleep(0.5)  # a second answer to one message would show by now
            return [e for _, e in client.events[after:]]
        await asyncio.sleep(0.05)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_fuzzed_bad_events_each_get_one_error_and_change_nothing(
    server: ServerProcess, peer: tuple[LoopThread, ClientPeer]
) -> None:
    loop, client = peer
    started = time.monotonic()
    first = len(client.events)
    codes: dict[str, int] = {}
    sent: list[Message] = []

    async def send_and_wait(message: Message) -> list[dict[str, Any]]:
        n = len(client.events)
        await send(client, message)
        await client.wait_event("error", timeout=ERROR_WAIT_S, after=n)
        return [e for _, e in client.events[n:]]

    @settings(
        max_examples=EVENTS,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(bad_messages)
    def check(message: Message) -> None:
        events = loop.run(send_and_wait(message), 2 * ERROR_WAIT_S)
        assert [e["type"] for e in events] == ["error"], (message, events)
        code = assert_error_event(events[0])
        codes[code] = codes.get(code, 0) + 1
        sent.append(message)

    check()
    one_by_one = len(sent)

    # the same messages back to back: still exactly one error each (some may be rate_limited)
    async def burst() -> list[dict[str, Any]]:
        n = len(client.events)
        for message in sent[:BURST]:
            await send(client, message)
        return await wait_errors(client, min(BURST, len(sent)), n)

    errors = loop.run(burst(), 2 * BURST_WAIT_S)
    assert [e["type"] for e in errors] == ["error"] * min(BURST, len(sent))
    burst_codes: dict[str, int] = {}
    for event in errors:
        code = assert_error_event(event)
        burst_codes[code] = burst_codes.get(code, 0) + 1

    # nothing changed: no update applied, no reply started, and the session still works
    kinds = {e["type"] for _, e in client.events[first:]}
    assert kinds == {"error"}, kinds

    async def still_works() -> tuple[dict[str, Any], dict[str, Any]]:
        n = len(client.events)
        client.send({"type": "session.update", "session": {"voice": "amy"}})
        updated = await client.wait_event("session.updated", after=n)
        client.send({"type": "conversation.item.create", "text": "hello after the fuzz"})
        done = await client.wait_event("response.done", timeout=15, after=n)
        return updated, done

    updated, done = loop.run(still_works(), 40)
    assert updated["version"] == 1 and updated["voice"] == "amy"  # the first update applied
    assert done["status"] == "completed"
    assert server.health()["sessions"] == 1
    print(
        "event fuzz:",
        json.dumps(
            {
                "one_by_one": one_by_one,
                "burst": len(errors),
                "burst_codes": dict(sorted(burst_codes.items())),
                "codes": dict(sorted(codes.items())),
                "seconds": round(time.monotonic() - started, 1),
            }
        ),
    )
    assert one_by_one >= 300
