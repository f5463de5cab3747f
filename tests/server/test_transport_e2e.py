"""Real peers over loopback: an aiortc client against the server process (tone pipeline)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest

from client.cli import load_wav, save_wav
from tests.support.pace import within
from tests.support.peers import Peer
from tests.support.server_process import (
    TONE_PIPELINE,
    ServerProcess,
    metric_value,
    server_process,
    tone_env,
)
from tests.support.speech import loud_seconds, rms, silence, speak, voiced_span_ms

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

QUESTION = "Hello there. What is the weather like today?"
INTERRUPT = "Wait, stop, I have another question."


server = server_process(
    {"transport.max_sessions": "3"},
    pipeline=TONE_PIPELINE,
    env=tone_env(2500, sentences=2),
    expect_log="all sessions closed",
)


@pytest.mark.parametrize("whip", [False, True], ids=["offer", "whip"])
async def test_spoken_question_gets_events_and_a_paced_reply(
    server: ServerProcess, peers: list[Peer], whip: bool
) -> None:
    question = speak(QUESTION)
    onset_ms, end_ms = voiced_span_ms(question)
    peer = Peer(server.url, whip=whip)
    peers.append(peer)
    await peer.connect()
    created = await peer.wait_event("session.created")
    assert created["session"]["id"] == peer.session_id
    assert len(peer.session_id or "") >= 22  # >= 128 random bits, URL-safe
    peer.mic.play(np.concatenate([silence(500), question]))
    started = await peer.wait_event("input_audio_buffer.speech_started", timeout=10)
    stopped = await peer.wait_event("input_audio_buffer.speech_stopped", timeout=15)
    # the input timeline starts at the first audio frame the server received
    assert abs(started["audio_start_ms"] - (500 + onset_ms)) < 300
    assert abs(stopped["audio_end_ms"] - (500 + end_ms)) < 400
    transcript = await peer.wait_event("conversation.item.input_audio_transcription.completed")
    assert transcript["transcript"].startswith("utterance of")
    created_resp = await peer.wait_event("response.created")
    assert created_resp["epoch"] == 0
    delta = await peer.wait_event("response.audio_transcript.delta")
    assert delta["epoch"] == 0 and delta["delta"].startswith("Tone number 1")
    done = await peer.wait_event("response.done", timeout=15)
    assert done["event_id"] > delta["event_id"] > created_resp["event_id"]  # in order sent
    assert done == {
        "event_id": done["event_id"],
        "type": "response.done",
        "epoch": 0,
        "status": "completed",
        "response_id": created_resp["response_id"],
        "item_id": created_resp["item_id"],
        "transcript": "Tone number 1 for epoch 0. Tone number 2 for epoch 0.",
    }
    assert delta["response_id"] == done["response_id"] and delta["item_id"] == done["item_id"]
    timings = await peer.wait_event("response.timings")
    assert timings["status"] == "completed" and timings["voice_to_voice_ms"] > 0
    await asyncio.sleep(0.5)
    # we heard the 2 x 2.5 s reply
    audio = peer.received_audio()
    assert 4.8 <= loud_seconds(audio) <= 5.2
    # pacing: audio arrives at real time, never ahead of it
    first, last = peer.audio[0][0], peer.audio[-1][0]
    assert len(audio) / 48_000 <= (last - first) + 0.3
    assert peer.video_count > 25  # video frames are flowing too


async def test_barge_in_silences_the_reply_and_bumps_the_epoch(
    server: ServerProcess, peers: list[Peer]
) -> None:
    peer = Peer(server.url, video=False)
    peers.append(peer)
    await peer.connect()
    peer.mic.play(np.concatenate([silence(300), speak(QUESTION)]))
    await peer.wait_event("response.audio_transcript.delta", timeout=15)
    # wait until the reply is audible at the client, then talk over it
    deadline = time.monotonic() + within(5)
    while time.monotonic() < deadline and not any(rms(p) > 1000 for _, p in peer.audio[-5:]):
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    peer.mic.play(speak(INTERRUPT))
    n = len(peer.events)
    truncated = await peer.wait_event("conversation.item.truncated", timeout=5, after=n)
    t_truncated = time.monotonic()
    assert truncated["epoch"] == 0
    assert truncated["audio_end_ms"] > 0
    # the cut chunk was heard up to audio_end_ms: the tone pipeline times its words evenly
    # (each 1/5 of the 2.5 s sentence), so exactly the words that ended by then were heard
    cut = next(
        e["delta"]
        for _, e in peer.events
        if e["type"] == "response.audio_transcript.delta" and e["chunk_id"] == truncated["chunk_id"]
    )
    words = cut.split()
    per_word = 2500 * 48 // len(words)  # samples at 48 kHz
    heard_words = round(truncated["audio_end_ms"] * 48) // per_word
    assert heard_words >= 1
    assert truncated["heard_text"] == " ".join(words[:heard_words])
    done = await peer.wait_event("response.done", after=n)
    assert done["status"] == "cancelled" and done["epoch"] == 0
    # the interrupted reply was heard: its latencies still count
    timings = await peer.wait_event("response.timings", after=n)
    assert timings["epoch"] == 0 and timings["status"] == "cancelled"
    assert timings["voice_to_voice_ms"] > 0
    # output is silent after the decision (the reply paused at the voice's onset, before it)
    # until a reply of the new epoch plays: "Wait, stop," may be a whole turn of its own,
    # ended 160 ms after it when it sounds complete
    await asyncio.sleep(0.8)
    newer = [
        t
        for t, e in peer.events[n:]
        if e["type"] == "output_audio_buffer.started" and e["epoch"] > 0
    ]
    until_t = min([*newer, time.monotonic()])
    after = [p for t, p in peer.audio if t_truncated + 0.05 < t < until_t]
    assert after and max(rms(p) for p in after) < 50
    # the interruption is a new turn: its reply carries the new epoch
    reply = await peer.wait_event("response.created", timeout=15, after=n)
    assert reply["epoch"] == 1
    metrics = server.metrics()
    assert metric_value(metrics, "avatar_barge_ins_total") >= 1
    assert metric_value(metrics, "avatar_barge_in_reaction_seconds_count") >= 1


async def test_data_channel_protocol(server: ServerProcess, peers: list[Peer]) -> None:
    peer = Peer(server.url, video=False)
    peers.append(peer)
    await peer.connect()
    await peer.wait_event("session.created")
    cases = [
        ("not json", "invalid_json"),
        ('{"type": "teleport"}', "unknown_event"),
        ('{"no_type": 1}', "invalid_event"),
        ('{"type": "session.update", "session": {"colour": "red"}}', "invalid_session_update"),
        ('{"type": "conversation.item.create", "text": "  "}', "invalid_item"),
        ('{"type": "playback.ack", "played_ms": -5}', "invalid_event"),
        ('{"type": "response.cancel", "event_id": "c1"}', "no_active_response"),
        ("x" * 20_000, "message_too_large"),
    ]
    for raw, code in cases:
        n = len(peer.events)
        peer.channel.send(raw)
        error = await peer.wait_event("error", after=n)
        assert error["error"]["code"] == code, raw
    peer.send({"type": "session.update", "session": {"voice": "amy", "appearance": "milo"}})
    updated = await peer.wait_event("session.updated")
    assert updated["voice"] == "amy" and updated["appearance"] == "milo"
    assert updated["version"] == 1
    # typed text is a whole turn: a reply follows
    peer.send({"type": "conversation.item.create", "text": "Hello by keyboard"})
    created = await peer.wait_event("response.created")
    assert created["epoch"] == 0
    before = server.metrics()
    peer.send({"type": "response.cancel"})
    done = await peer.wait_event("response.done")
    assert done["status"] == "cancelled"
    # a cancel is an interruption like speech: counted, with what it threw away
    after = server.metrics()
    for name in ("avatar_barge_ins_total", "avatar_discarded_output_seconds_count"):
        assert metric_value(after, name) == metric_value(before, name) + 1, name


async def test_bad_requests_leave_nothing_behind(server: ServerProcess) -> None:
    before = await server.wait_sessions(0, 10)
    url = server.url
    big = "v=0\r\n" + "a=x\r\n" * 20_000
    async with aiohttp.ClientSession() as http:
        cases: list[tuple[str, str, dict[str, Any], int]] = [
            (
                "post",
                "/offer",
                {"data": "{nope", "headers": {"Content-Type": "application/json"}},
                400,
            ),
            ("post", "/offer", {"json": {"type": "offer", "sdp": "hello"}}, 400),
            ("post", "/offer", {"json": {"type": "answer", "sdp": "v=0"}}, 400),
            ("post", "/offer", {"json": {"type": "offer", "sdp": "v=0\r\nm=audio 9 X 0\r\n"}}, 400),
            ("post", "/offer", {"data": "{}", "headers": {"Content-Type": "text/plain"}}, 415),
            ("post", "/offer", {"json": {"type": "offer", "sdp": big}}, 413),
            (
                "post",
                "/whip",
                {"data": "v=0", "headers": {"Content-Type": "application/json"}},
                415,
            ),
            (
                "post",
                "/whip",
                {"data": "garbage", "headers": {"Content-Type": "application/sdp"}},
                400,
            ),
            ("post", "/whip", {"data": big, "headers": {"Content-Type": "application/sdp"}}, 413),
            ("delete", "/whip/not-a-session", {}, 404),
        ]
        for method, path, kwargs, status in cases:
            async with http.request(method, url + path, **kwargs) as resp:
                assert resp.status == status, (path, kwargs.keys(), await resp.text())
                body = await resp.json()
                assert isinstance(body["error"], str) and body["error"]
    await server.wait_settled(before["tasks"], 10)  # no peer, no task left behind


async def test_full_server_answers_503_and_others_keep_going(
    server: ServerProcess, peers: list[Peer]
) -> None:
    await server.wait_sessions(0, 10)
    for _ in range(3):
        peer = Peer(server.url, video=False)
        peers.append(peer)
        await peer.connect()
    extra = Peer(server.url, video=False)
    with pytest.raises(RuntimeError, match="offer 503"):
        await extra.connect()
    await extra.close()
    async with aiohttp.ClientSession() as http:
        offer = {"type": "offer", "sdp": peers[0].pc.localDescription.sdp}
        async with http.post(server.url + "/offer", json=offer) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "5"
            assert (await resp.json())["error"]
    assert metric_value(server.metrics(), "avatar_sessions_rejected_total") >= 2
    # the connected sessions still work
    peers[0].send({"type": "conversation.item.create", "text": "still there?"})
    await peers[0].wait_event("response.created")
    for peer in list(peers):
        await peer.close()
        peers.remove(peer)
    health = await server.wait_sessions(0, 10)
    assert health["sessions"] == 0


async def test_vanished_client_is_cleaned_up(server: ServerProcess) -> None:
    await server.wait_sessions(0, 10)
    peer = Peer(server.url, video=False)
    await peer.connect()
    assert (await server.wait_sessions(1, 10))["sessions"] == 1
    await peer.close()  # /offer clients have no DELETE: the peer connection just goes away
    assert (await server.wait_sessions(0, 20))["sessions"] == 0


async def test_whip_resource_lifecycle(server: ServerProcess) -> None:
    await server.wait_sessions(0, 10)
    peer = Peer(server.url, whip=True, video=False)
    await peer.connect()
    assert peer.location is not None and peer.location.startswith("/whip/")
    async with aiohttp.ClientSession() as http:
        offer = peer.pc.localDescription.sdp
        headers = {"Content-Type": "application/sdp"}
        async with http.post(server.url + "/whip", data=offer, headers=headers) as resp:
            assert resp.status == 201
            assert resp.content_type == "application/sdp"
            assert (await resp.text()).startswith("v=0")
            second = resp.headers["Location"]
        assert (await server.wait_sessions(2, 10))["sessions"] == 2
        for location in (peer.location, second):
            async with http.delete(server.url + location) as resp:
                assert resp.status == 200
            async with http.delete(server.url + location) as resp:
                assert resp.status == 404  # gone, and only once
    await peer.close(delete=False)
    assert (await server.wait_sessions(0, 10))["sessions"] == 0


def test_command_line_peer_records_a_reply(server: ServerProcess, tmp_path: Path) -> None:
    wav = tmp_path / "question.wav"
    save_wav(wav, np.concatenate([silence(300), speak(QUESTION)]))
    out_wav, out_mp4 = tmp_path / "reply.wav", tmp_path / "reply.mp4"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "client.cli",
            "--url",
            server.url,
            "--wav",
            str(wav),
            "--duration",
            "9",
            "--record-audio",
            str(out_wav),
            "--record-video",
            str(out_mp4),
            "--pin-host",
            "127.0.0.1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    kinds = [event["type"] for event in printed]
    # the command line speaks the GA dialect (``oai-events``): GA's session, then the server's
    for kind in (
        "session.created",
        "x-avatar.session",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "response.created",
        "response.output_audio_transcript.delta",
    ):
        assert kind in kinds, kinds
    assert kinds.index("session.created") < kinds.index("x-avatar.session")
    assert printed[kinds.index("session.created")]["session"]["type"] == "realtime"
    assert all(isinstance(event.get("event_id"), str) for event in printed)
    assert "response.audio_transcript.delta" not in kinds  # no native event names
    audio = load_wav(out_wav)
    assert rms(audio) > 500  # the tone reply was recorded
    with av.open(str(out_mp4)) as container:
        assert container.streams.video[0].frames > 50


def test_command_line_peer_types_a_message(server: ServerProcess) -> None:
    """``--text``: in GA an item alone asks for nothing, so the client adds the user message
    and then asks for a response; the reply comes (events only: no audio, no video)."""
    command = [sys.executable, "-m", "client.cli", "--url", server.url, "--text", "Hi by keyboard"]
    options = ["--no-audio", "--no-video", "--duration", "3", "--pin-host", "127.0.0.1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(command + options, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    kinds = [event["type"] for event in printed]
    users = [
        e["item"]
        for e in printed
        if e["type"] == "conversation.item.added" and e["item"]["role"] == "user"
    ]
    assert [u["content"][0]["text"] for u in users] == ["Hi by keyboard"], printed
    assert "response.created" in kinds and "response.output_audio_transcript.delta" in kinds
    assert kinds.index("conversation.item.added") < kinds.index("response.created")
    assert "error" not in kinds, printed


async def test_engine_failure_ends_only_that_reply() -> None:
    server = ServerProcess({"pipeline.factory": "tests.support.tone_pipeline:create_flaky"}).start()
    try:
        a = Peer(server.url, video=False)
        b = Peer(server.url, video=False)
        await a.connect()
        await b.connect()
        a.send({"type": "conversation.item.create", "text": "first"})  # reply 1: engine raises
        error = await a.wait_event("error", timeout=10)
        assert error["error"]["code"] == "engine_error"
        # the engine's own words stay in the server's log (SECURITY.md: llama.cpp's limits)
        assert "speech engine crashed" not in error["error"]["message"]
        assert error["error"]["type"] == "server_error"
        failed = await a.wait_event("response.done", timeout=10)
        assert failed["status"] == "failed"
        n = len(a.events)
        b.send({"type": "conversation.item.create", "text": "other session"})  # reply 2: works
        assert (await b.wait_event("response.done", timeout=10))["status"] == "completed"
        a.send({"type": "conversation.item.create", "text": "again"})  # reply 3 fails, 4 works
        await a.wait_event("error", timeout=10, after=n)
        await a.wait_event("response.done", timeout=10, after=n)
        n = len(a.events)
        a.send({"type": "conversation.item.create", "text": "and again"})
        done = await a.wait_event("response.done", timeout=10, after=n)
        assert done["status"] == "completed"  # the session kept going
        assert server.health()["sessions"] == 2
        await a.close()
        await b.close()
    finally:
        assert server.stop() == 0
