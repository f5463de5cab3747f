"""The ``events`` channel against a hostile peer (security issue items 3 and 6), through real
aiortc peers and the real app served in this process (so the test sees the server's objects).

- A peer that never acknowledges the server's SCTP data while it sends bad events: what the
  server queues towards it stays under 1 MiB, and past that the session is closed with a log
  line naming it.
- Long client values are never echoed: an unknown ``type``, an unknown ``session.update``
  field, an ``event_id``.
- Only the first ``events`` channel of a session is used; further channels (of any label) are
  closed, with no task and no ``session.created`` of their own.
- A message nested 1,000 deep, a text message that is not UTF-8: one ``error`` each, and the
  session goes on. Malformed channel-open messages (a label that is not UTF-8, a second open
  on a stream that is open) are ignored, and the session goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from aiortc import RTCDataChannel

from server.http.signaling import REGISTRY_KEY
from tests.support.hostile_peers import send_channel_open, send_raw_text, stop_acknowledging
from tests.support.in_process import running
from tests.support.pace import within
from tests.support.peers import Peer, connected, server_side

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

QUEUE_CAP_BYTES = 1024 * 1024  # the documented cap on events queued towards one peer
MAX_QUOTED_CHARS = 64  # a client value quoted in an error message
MAX_ERROR_MESSAGE_CHARS = 256
MAX_BAD_EVENTS = 30_000  # the unacknowledging peer gives up after this many
OWN_QUEUE_BYTES = 64 * 1024  # the attacker lets its own channel drain past this
EXTRA_CHANNELS = 40
OTHER_CHANNELS = 5


async def answers(peer: Peer, after: int, count: int = 1) -> list[dict[str, Any]]:
    """The events from index ``after`` on once ``count`` arrived, and a moment more (a second
    answer to one message would show by then)."""
    deadline = time.monotonic() + within(10)
    while len(peer.events) - after < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    return [e for _, e in peer.events[after:]]


async def still_works(peer: Peer, voice: str = "amy") -> None:
    """A valid update is applied and answered: the session and its transport are alive."""
    n = len(peer.events)
    peer.send({"type": "session.update", "session": {"voice": voice}})
    updated = await peer.wait_event("session.updated", after=n)
    assert updated["voice"] == voice


def no_aiortc_warnings(caplog: pytest.LogCaptureFixture) -> None:
    """aiortc logs a traceback (WARNING) when a transport dies in its receive path."""
    bad = [
        r for r in caplog.records if r.name.startswith("aiortc") and r.levelno >= logging.WARNING
    ]
    assert not bad, [r.getMessage()[:300] for r in bad]


async def test_unacknowledging_peer_is_closed_at_the_queue_cap(
    peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="server")
    # no events budget: every bad event is answered, so the answers pile up towards the peer
    # (with it they are few: tests/server/rtc/test_session_budget_e2e.py)
    async with running({"session.max_events_per_s": "0"}) as (url, app):
        registry = app[REGISTRY_KEY]
        peer = await connected(url, peers)
        session_id = peer.session_id
        assert session_id is not None
        channel = server_side(app, peer)._channel
        assert channel is not None
        stop_acknowledging(peer)
        bad = json.dumps({"type": "y" * 200, "event_id": "e" * 64})
        sent, peak = 0, 0
        deadline = time.monotonic() + within(60)
        while session_id in registry.conversations and sent < MAX_BAD_EVENTS:
            assert time.monotonic() < deadline, f"{sent} sent, {channel.bufferedAmount} queued"
            peak = max(peak, channel.bufferedAmount)
            if peer.channel.readyState != "open":
                break
            if peer.channel.bufferedAmount > OWN_QUEUE_BYTES:
                await asyncio.sleep(0.005)
                continue
            for _ in range(32):
                peer.channel.send(bad)
            sent += 32
            await asyncio.sleep(0)
        queued = channel.bufferedAmount
        assert session_id not in registry.conversations, (
            f"session still open after {sent} bad events: {queued} bytes queued towards the peer"
        )
        assert peak <= QUEUE_CAP_BYTES, peak
        lines = [r.getMessage() for r in caplog.records if r.name == "server.rtc.peer"]
        assert any(session_id[:8] in line and "closing the session" in line for line in lines)
        print(f"unacked peer: closed after {sent} bad events, peak queue {peak} bytes")


async def test_long_client_values_are_not_echoed(peers: list[Peer]) -> None:
    async with running() as (url, _):
        peer = await connected(url, peers)
        long = "z" * 12_000
        messages: list[dict[str, Any]] = [
            {"type": long},
            {"type": "session.update", "session": {long: "x"}},
            {"type": "response.cancel", "event_id": long},
            {"type": long, "event_id": long},
        ]
        for message in messages:
            n = len(peer.events)
            peer.send(message)
            events = await answers(peer, n)
            assert [e["type"] for e in events] == ["error"], events
            text = json.dumps(events[0])
            assert "z" * (MAX_QUOTED_CHARS + 1) not in text, (message.keys(), text[:200])
            assert len(events[0]["error"]["message"]) <= MAX_ERROR_MESSAGE_CHARS
        await still_works(peer)


async def test_only_the_first_events_channel_is_used(
    peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="server")
    async with running() as (url, app):
        peer = await connected(url, peers)
        server = server_side(app, peer)
        tasks_before = len(server.tasks)
        extra: list[tuple[RTCDataChannel, list[object]]] = []
        labels = ["events"] * EXTRA_CHANNELS + [f"other-{i}" for i in range(OTHER_CHANNELS)]
        for label in labels:
            channel = peer.pc.createDataChannel(label)
            received: list[object] = []
            channel.on("message", received.append)
            extra.append((channel, received))
        deadline = time.monotonic() + within(20)
        while any(c.readyState != "closed" for c, _ in extra) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        states = [c.readyState for c, _ in extra]
        created = sum(len(received) for _, received in extra)
        assert created == 0, f"{created} messages on the extra channels"
        assert [e["type"] for _, e in peer.events].count("session.created") == 1
        assert len(server.tasks) == tasks_before, [t.get_name() for t in server.tasks]
        assert states == ["closed"] * len(extra), states
        refusals = [r for r in caplog.records if "refusing data channel" in r.getMessage()]
        assert len(refusals) == 1  # logged once per session, not once per channel
        await still_works(peer)


async def test_deeply_nested_message_gets_one_error_and_the_session_goes_on(
    peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    async with running() as (url, _):
        peer = await connected(url, peers)
        for message in ("[" * 1000, "[" * 1000 + "]" * 1000, '{"type": ' + "{" * 1000):
            n = len(peer.events)
            peer.channel.send(message)
            events = await answers(peer, n)
            assert [e["type"] for e in events] == ["error"], events
            assert events[0]["error"]["type"] == "invalid_request_error"
        await still_works(peer)
        no_aiortc_warnings(caplog)


async def test_text_that_is_not_utf8_gets_one_error_and_the_session_goes_on(
    peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    async with running() as (url, _):
        peer = await connected(url, peers)
        for raw in (b'{"type": "\xff"}', b"\xc3\x28", b"\xed\xa0\x80", b'{"type": "ok"}\x80'):
            n = len(peer.events)
            await send_raw_text(peer, raw)
            events = await answers(peer, n)
            assert [e["type"] for e in events] == ["error"], events
            assert events[0]["error"]["code"] == "invalid_utf8"
        await still_works(peer)
        no_aiortc_warnings(caplog)


@pytest.mark.parametrize("case", ["label-not-utf8", "second-open-on-open-stream"])
async def test_malformed_channel_open_is_ignored_and_the_session_goes_on(
    case: str, peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    async with running() as (url, app):
        peer = await connected(url, peers)
        server = server_side(app, peer)
        tasks_before = len(server.tasks)
        n = len(peer.events)
        if case == "label-not-utf8":
            await send_channel_open(peer, b"ev\xffents")
        else:
            await send_channel_open(peer, b"events", on_open_channel=True)
        await asyncio.sleep(0.5)
        assert [e for _, e in peer.events[n:]] == []
        assert len(server.tasks) == tasks_before
        await still_works(peer)
        no_aiortc_warnings(caplog)
        # the guard is the server connection's own: the client's transport (same class, same
        # process) has aiortc's receive step untouched
        assert server.pc.sctp is not None and "_data_channel_receive" in vars(server.pc.sctp)
        assert peer.pc.sctp is not None and "_data_channel_receive" not in vars(peer.pc.sctp)
