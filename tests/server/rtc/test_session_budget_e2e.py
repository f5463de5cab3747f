"""One session's budgets for events and inbound media, against a hostile aiortc peer and the
real app served in this process (so the test sees the server's objects and /metrics).

The attacks (security finding "no rate on events or media"):
- a flood of invalid events, each of which used to be answered with an ``error``;
- a flood of Opus packets 40 times faster than real time, each of which used to be decoded
  and heard;
- RTP timestamps that jump ~1 s at every packet, each jump of which used to be filled with
  concealment and silence.

Every bound below is what the documented budget allows over the time the test measured (an
upper bound of the time the server had): the tests assert behaviour, not speed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import av
import pytest
from aiohttp import web
from aiortc import RTCRtpSender

from server.http.app import METRICS_KEY
from server.http.signaling import REGISTRY_KEY
from server.rtc.jitter import ArrivalBuffer
from server.rtc.peer import PeerSession
from server.rtc.settings import audio_jitter_buffer
from tests.support.in_process import running
from tests.support.pace import within
from tests.support.peers import Peer, connected, server_side
from tests.support.rtp_abuse import FloodingSender, JumpingSender, RewritingSender
from tests.support.server_process import metric_value

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

# the documented defaults (server/config.py), as numbers: the contract
EVENTS_PER_S = 20.0
EVENTS_BURST = 50
PACKETS_PER_S = 100.0
PACKETS_BURST = 100
HEARD_PER_S = 1.5  # s of audio heard (real and filled together) a second
HEARD_BURST_S = 3.0  # a longest gap (1 s) and a 2 s backlog
FLOOD_FACTOR = 10

# the throttled session is measured, whatever the flood's length on this machine (a flood
# this fast, for session.flood_s, ends the session: tested on its own below)
NOT_ENDED = {"session.flood_s": "0"}
FLOOD_EVENTS = 10_000
OWN_QUEUE_BYTES = 64 * 1024  # the attacker lets its own channel drain past this
FLOOD_COPIES = 40  # each 20 ms packet 40 times: 2,000 packets a second
FLOOD_S = 1.5
JUMP_MS = 980.0  # just under the longest gap the inbound path fills
JUMP_S = 2.0
RATE_LIMITED = "avatar_session_rate_limited_total"
LOST = "avatar_inbound_audio_lost_seconds_total"


def metrics(app: web.Application) -> str:
    return app[METRICS_KEY].render().decode()


def errors(peer: Peer, after: int) -> list[dict[str, Any]]:
    return [e for _, e in peer.events[after:] if e["type"] == "error"]


async def settled(read: Callable[[], object], quiet_s: float = 1.0, limit_s: float = 30) -> float:
    """Until ``read()`` stays the same for ``quiet_s``; the time then (``time.monotonic()``)."""
    deadline = time.monotonic() + within(limit_s)
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
    return time.monotonic()


async def flood_events(peer: Peer, count: int, message: str) -> None:
    """``count`` copies of ``message`` as fast as the peer's channel takes them."""
    sent = 0
    while sent < count:
        if peer.channel.readyState != "open":
            return
        if peer.channel.bufferedAmount > OWN_QUEUE_BYTES:
            await asyncio.sleep(0.002)
            continue
        batch = min(64, count - sent)
        for _ in range(batch):
            peer.channel.send(message)
        sent += batch
        await asyncio.sleep(0)


def audio_sender(peer: Peer) -> RTCRtpSender:
    (sender,) = [t.sender for t in peer.pc.getTransceivers() if t.kind == "audio"]
    return sender


def arrival_buffer(server: PeerSession) -> ArrivalBuffer:
    (receiver,) = [t.receiver for t in server.pc.getTransceivers() if t.kind == "audio"]
    buffer = audio_jitter_buffer(receiver)
    assert isinstance(buffer, ArrivalBuffer)
    return buffer


class Hearing:
    """The seconds of audio a server-side conversation hears (frames handed to ``hear``)."""

    def __init__(self, server: PeerSession, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seconds = 0.0
        hear = server.conversation.hear

        async def hearing(frame: av.AudioFrame, arrival_ms: float) -> None:
            self.seconds += frame.samples / frame.sample_rate
            await hear(frame, arrival_ms)

        monkeypatch.setattr(server.conversation, "hear", hearing)


async def run_for(sender: RewritingSender, seconds: float) -> None:
    """Let the hostile sender send for ``seconds`` of its own packets, then stop it."""
    deadline = time.monotonic() + within(10)
    while sender.first_at is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert sender.first_at is not None, "the client sent no audio"
    await asyncio.sleep(seconds)
    sender.stop()


async def test_an_events_flood_gets_a_bounded_number_of_answers_and_the_session_goes_on(
    peers: list[Peer],
) -> None:
    async with running(NOT_ENDED) as (url, app):
        peer = await connected(url, peers)

        def dropped() -> float:
            return metric_value(metrics(app), RATE_LIMITED, 'kind="events"')

        n = len(peer.events)
        started = time.monotonic()
        await flood_events(peer, FLOOD_EVENTS, json.dumps({"type": "no.such.event"}))
        ended = await settled(lambda: (len(peer.events), dropped()))
        answers = errors(peer, n)
        codes = [e["error"]["code"] for e in answers]
        allowed = EVENTS_BURST + EVENTS_PER_S * (ended - started) + 1
        print(
            f"events flood: {FLOOD_EVENTS} sent, {len(answers)} answered in {ended - started:.1f} s"
        )
        assert len(answers) <= allowed, (len(answers), allowed)
        # one per throttling episode: a new one only after the bucket refilled whole
        episodes = 1 + (ended - started) * EVENTS_PER_S / EVENTS_BURST
        assert 1 <= codes.count("rate_limited") <= episodes, codes[:80]
        rate_limited = next(e for e in answers if e["error"]["code"] == "rate_limited")
        assert rate_limited["error"]["type"] == "invalid_request_error"
        assert dropped() == FLOOD_EVENTS - (len(answers) - 1)  # every event answered or counted
        # a legitimate event afterwards is taken and answered
        n = len(peer.events)
        peer.send({"type": "session.update", "session": {"voice": "amy"}})
        updated = await peer.wait_event("session.updated", after=n)
        assert updated["voice"] == "amy"
        assert peer.session_id in app[REGISTRY_KEY].conversations


async def test_events_far_past_the_budget_for_seconds_end_the_session(
    peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="server")
    async with running({"session.flood_s": "2"}) as (url, app):
        registry = app[REGISTRY_KEY]
        peer = await connected(url, peers)
        session_id = peer.session_id
        assert session_id is not None
        bystander = await connected(url, peers)
        message = json.dumps({"type": "no.such.event"})
        deadline = time.monotonic() + within(30)
        while session_id in registry.conversations and time.monotonic() < deadline:
            await flood_events(peer, 64 * 8, message)  # far over 10x 20 a second
            await asyncio.sleep(0.01)
        assert session_id not in registry.conversations
        assert bystander.session_id in registry.conversations
        lines = [r.getMessage() for r in caplog.records if r.name == "server.rtc.peer"]
        assert any(session_id[:8] in line and "flood" in line for line in lines), lines
        assert metric_value(metrics(app), "avatar_sessions_let_go_total", 'reason="flooded"') == 1
        n = len(bystander.events)
        bystander.send({"type": "session.update", "session": {"voice": "amy"}})
        await bystander.wait_event("session.updated", after=n)


async def test_a_packet_flood_is_dropped_before_decoding_and_counted(
    peers: list[Peer], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(NOT_ENDED) as (url, app):
        peer = await connected(url, peers, audio=True)
        server = server_side(app, peer)
        buffer = arrival_buffer(server)
        hearing = Hearing(server, monkeypatch)
        flood = FloodingSender(audio_sender(peer), FLOOD_COPIES)
        await run_for(flood, FLOOD_S)
        ended = await settled(lambda: (buffer.released, hearing.seconds))
        assert flood.first_at is not None
        elapsed = ended - flood.first_at
        limited = getattr(buffer, "limited", 0)
        received = buffer.released + buffer.dropped + limited
        print(
            f"packet flood: {flood.sent} sent, {received} received, {buffer.released} released, "
            f"{hearing.seconds:.1f} s heard in {elapsed:.1f} s"
        )
        assert received > 0.5 * flood.sent  # loopback: most arrive
        assert buffer.released <= PACKETS_BURST + PACKETS_PER_S * elapsed + 1
        assert hearing.seconds <= HEARD_BURST_S + HEARD_PER_S * elapsed + 0.1
        counted = metric_value(metrics(app), RATE_LIMITED, 'kind="media"')
        assert counted == limited >= received - buffer.released - buffer.dropped
        assert peer.session_id in app[REGISTRY_KEY].conversations  # throttled, not ended


async def test_a_sustained_packet_flood_ends_the_session(
    peers: list[Peer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="server")
    settings = {"session.flood_s": "1", "transport.max_media_packets_per_s": "50"}
    async with running(settings) as (url, app):
        registry = app[REGISTRY_KEY]
        peer = await connected(url, peers, audio=True)
        session_id = peer.session_id
        assert session_id is not None
        flood = FloodingSender(audio_sender(peer), FLOOD_COPIES)  # 40x the budget
        deadline = time.monotonic() + within(15)
        while session_id in registry.conversations and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        flood.stop()
        assert session_id not in registry.conversations
        lines = [r.getMessage() for r in caplog.records if r.name == "server.rtc.peer"]
        assert any(session_id[:8] in line and "flood" in line for line in lines), lines
        assert metric_value(metrics(app), "avatar_sessions_let_go_total", 'reason="flooded"') == 1


async def test_timestamp_jumps_synthesise_bounded_audio(
    peers: list[Peer], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running() as (url, app):
        peer = await connected(url, peers, audio=True)
        server = server_side(app, peer)
        buffer = arrival_buffer(server)
        hearing = Hearing(server, monkeypatch)
        jumps = JumpingSender(audio_sender(peer), JUMP_MS)
        await run_for(jumps, JUMP_S)
        ended = await settled(lambda: (buffer.released, hearing.seconds))
        assert jumps.first_at is not None
        elapsed = ended - jumps.first_at
        text = metrics(app)
        synthesised = metric_value(text, LOST)  # concealment, FEC and silence together
        print(
            f"timestamp jumps: {jumps.sent} packets jumping {JUMP_MS:.0f} ms, "
            f"{synthesised:.1f} s synthesised, {hearing.seconds:.1f} s heard in {elapsed:.1f} s"
        )
        assert buffer.released >= 0.5 * jumps.sent  # a normal packet rate: not throttled
        assert synthesised <= HEARD_BURST_S + HEARD_PER_S * elapsed
        assert hearing.seconds <= HEARD_BURST_S + HEARD_PER_S * elapsed + 0.1
        assert metric_value(text, RATE_LIMITED, 'kind="jump"') > 0
        assert peer.session_id in app[REGISTRY_KEY].conversations
