"""The avatar through real peers: viseme events ahead of their audio, video on or off."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter

import numpy as np
import pytest

from client.cli import ClientPeer
from server.rtc.tracks import MAX_CATCH_UP_MS
from tests.support.faces import StillCamera, draw_face
from tests.support.pace import within
from tests.support.peers import Peer
from tests.support.server_process import TONE_PIPELINE, ServerProcess, server_process, tone_env

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

FRAME = 960  # samples per received 20 ms audio frame


server = server_process(
    {"transport.max_sessions": "3"}, pipeline=TONE_PIPELINE, env=tone_env(1200, sentences=2)
)


SKIPPED = re.compile(r"audio track woke \d+ ms late: (\d+) ms of media time skipped")


def skips(peer: ClientPeer) -> list[int]:
    """The media time (samples) the server's audio track skipped before each received frame:
    a track that wakes more than MAX_CATCH_UP_MS late (a held loop) sends nothing for the
    missed time and goes on from the sample where it stopped (server/rtc/tracks.py), so the
    client sees the RTP timestamps jump that much. A shorter jump (a lost packet) is no skip."""
    gaps, last = [], None
    for pts in peer.audio_pts:
        gap = 0 if last is None else (pts - last) % 2**32 - FRAME
        gaps.append(gap if gap * 1000 >= MAX_CATCH_UP_MS * 48_000 else 0)
        last = pts
    return gaps


def output_positions(peer: ClientPeer) -> list[int]:
    """The output position (samples on the server's output timeline, which ``pts_ms`` is on)
    of each received audio frame: its RTP offset from the first frame, less the media time
    skipped before it (``skips``)."""
    base, skipped, positions = peer.audio_pts[0], 0, []
    for pts, gap in zip(peer.audio_pts, skips(peer), strict=True):
        skipped += gap
        positions.append((pts - base) % 2**32 - skipped)
    return positions


def audio_arrival(peer: ClientPeer, position: int) -> float | None:
    """Client arrival time of the received audio frame holding output ``position`` (samples)."""
    for (arrival, _), start in zip(peer.audio, output_positions(peer), strict=True):
        if start <= position < start + FRAME:
            return arrival
    return None


async def test_viseme_events_arrive_before_their_audio(
    server: ServerProcess, peers: list[Peer]
) -> None:
    peer = Peer(server.url)
    peers.append(peer)
    await peer.connect()
    created = await peer.wait_event("session.created")
    assert created["session"]["video"] is True
    assert len(created["session"]["appearances"]) >= 2
    logged = len(server.log())
    peer.send({"type": "conversation.item.create", "text": "Show me your face"})
    await peer.wait_event("response.done", timeout=20)
    visemes = [(t, e) for t, e in peer.events if e["type"] == "avatar.viseme"]
    assert len(visemes) >= 20  # 2 x 1.2 s of 100 ms phonemes
    assert {e["epoch"] for _, e in visemes} == {0}
    pts = [e["pts_ms"] for _, e in visemes]
    assert pts == sorted(pts)
    # response.done leaves with the last audio pulled: the client has that audio a little
    # later (its jitter buffer, a busy machine)
    last = round((pts[-1] + visemes[-1][1]["duration_ms"]) * 48) - FRAME
    deadline = time.monotonic() + within(2)
    while max(output_positions(peer)) < last and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    # the jumps taken for skips are the server's own, as its log tells them
    told = Counter(int(ms) * 48 for ms in SKIPPED.findall(server.log()[logged:]))
    assert not Counter(gap for gap in skips(peer) if gap) - told, (skips(peer), told)
    margins = []
    for arrival, event in visemes:
        heard = audio_arrival(peer, round(event["pts_ms"] * 48))
        assert heard is not None, event
        margins.append(heard - arrival)
    assert min(margins) >= 0, f"a viseme event arrived after its audio: {min(margins):.3f} s"
    # the audio at each cue's pts is the reply tone (the cue is on the right clock)
    received = peer.received_audio()
    positions = output_positions(peer)
    for _, event in visemes[:: max(1, len(visemes) // 8)]:
        heard_at = round(event["pts_ms"] * 48)
        index = next(i for i, p in enumerate(positions) if p + FRAME > heard_at)
        chunk = received[index * FRAME : (index + 2) * FRAME]
        assert np.abs(chunk).max() > 1000, event
    # video flows along: wait for it, since a slow machine decodes fewer frames a second
    deadline = time.monotonic() + within(5)
    while peer.video_count <= 25 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert peer.video_count > 25


async def test_event_only_client_gets_visemes_without_video(
    server: ServerProcess, peers: list[Peer]
) -> None:
    peer = Peer(server.url, video=False)
    peers.append(peer)
    await peer.connect()
    created = await peer.wait_event("session.created")
    assert created["session"]["video"] is False
    peer.send({"type": "conversation.item.create", "text": "Just the events"})
    event = await peer.wait_event("avatar.viseme", timeout=15)
    assert set(event) >= {"pts_ms", "viseme", "weight", "epoch", "name"}
    assert 0 <= event["viseme"] <= 14 and 0.0 <= event["weight"] <= 1.0
    await peer.wait_event("response.done", timeout=20)
    assert peer.video_count == 0


async def test_data_channel_only_client_gets_the_reply_played_out(
    server: ServerProcess, peers: list[Peer]
) -> None:
    """An offer with no audio and no video m-line: the reply is still played out on the
    session's clock, so its events keep time and it ends with response.done."""
    peer = Peer(server.url, video=False, audio=False)
    peers.append(peer)
    await peer.connect()
    created = await peer.wait_event("session.created")
    assert created["session"]["audio"] is False and created["session"]["video"] is False
    peer.send({"type": "conversation.item.create", "text": "Only the data channel"})
    first = await peer.wait_event("response.audio_transcript.delta", timeout=15)
    done = await peer.wait_event("response.done", timeout=20)
    assert done["status"] == "completed"
    stamps = {id(e): t for t, e in peer.events}
    # paced like audio, not dumped: the events of 2 x 1.2 s of speech span about that long
    assert stamps[id(done)] - stamps[id(first)] >= 2 * 1.2 - 0.2
    pts = [e["pts_ms"] for _, e in peer.events if e["type"] == "avatar.viseme"]
    assert pts == sorted(pts) and pts[-1] - pts[0] >= 2 * 1.2 * 1000 - 300
    # an interruption knows how far the unsent audio had been played
    n = len(peer.events)
    peer.send({"type": "conversation.item.create", "text": "Say it again"})
    await peer.wait_event("response.audio_transcript.delta", timeout=15, after=n)
    await asyncio.sleep(0.6)
    peer.send({"type": "response.cancel"})
    truncated = await peer.wait_event("conversation.item.truncated", timeout=10, after=n)
    assert 0 < truncated["audio_end_ms"] <= 1200  # within the sentence that was playing
    done = await peer.wait_event("response.done", timeout=10, after=n)
    assert done["status"] == "cancelled"
    assert not peer.audio and peer.video_count == 0


async def test_appearance_update_is_validated_and_applied(
    server: ServerProcess, peers: list[Peer]
) -> None:
    peer = Peer(server.url, video=True)
    peer.keep_video_frames = 5000
    peers.append(peer)
    await peer.connect()
    created = await peer.wait_event("session.created")
    names = created["session"]["appearances"]
    n = len(peer.events)
    peer.send({"type": "session.update", "session": {"appearance": "robot"}})
    error = await peer.wait_event("error", after=n)
    assert "unknown appearance" in error["error"]["message"]
    deadline = time.monotonic() + within(5)
    while len(peer.video_frames) < 10 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    before = peer.video_frames[-1][1].to_ndarray(format="rgb24")
    peer.send({"type": "session.update", "session": {"appearance": names[1]}})
    updated = await peer.wait_event("session.updated", after=n)
    assert updated["appearance"] == names[1]
    # another look: the picture changes far more than idle motion changes it
    change = 0.0
    deadline = time.monotonic() + within(10)
    while change <= 8 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        after = peer.video_frames[-1][1].to_ndarray(format="rgb24")
        change = float(np.abs(after.astype(int) - before.astype(int)).mean())
    assert change > 8


async def test_camera_presence_steers_events_and_the_persona(
    server: ServerProcess, peers: list[Peer]
) -> None:
    camera = StillCamera(draw_face(cx=200))  # the face left of centre in the user's picture
    peer = Peer(server.url, camera=camera)
    peers.append(peer)
    await peer.connect()
    await peer.wait_event("session.created")
    present = await peer.wait_event("vision.presence", timeout=10)
    assert present["present"] is True and present["x"] < -0.1
    updated = await peer.wait_event("session.updated", where=lambda e: bool(e["presence"]))
    assert "in front of the camera" in updated["presence"]
    n = len(peer.events)
    camera.image = np.full_like(camera.image, 90)  # the user walks away
    away = await peer.wait_event("vision.presence", timeout=10, after=n)
    assert away["present"] is False and away["state"] == "away"
    updated = await peer.wait_event("session.updated", after=n)
    assert "stepped away" in updated["presence"]
