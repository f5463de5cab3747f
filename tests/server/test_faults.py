"""Faults: an engine that raises, hangs or dies mid-reply fails only that reply of that session;
a full server answers 503 while the sessions it has play on without an underrun.

The server runs tests/support/fault_pipeline.py: typed text ``fault:<name>`` makes that reply's
engine fail, ``arm:<name>`` makes the session's next final transcription fail. Engine calls that
take longer than ``pipeline.stage_timeout_s`` (1 s here) end the reply with ``engine_timeout``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import numpy as np
import pytest

from client.cli import ClientPeer
from tests.support.fault_pipeline import ARM_PREFIX, FAULT_PREFIX, Fault
from tests.support.pace import within
from tests.support.peers import Peer, keep_talking
from tests.support.server_process import (
    TONE_PIPELINE,
    ServerProcess,
    metric_value,
    server_process,
    tone_env,
)
from tests.support.speech import loud_seconds, silence, speak

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

STAGE_TIMEOUT_S = 1.0
SENTENCE_MS = 800  # two sentences a reply

# (fault, error code, sentences the user hears before the failure)
TEXT_FAULTS = [
    (Fault.REPLY_RAISES, "engine_error", 0),
    (Fault.REPLY_HANGS, "engine_timeout", 0),
    (Fault.REPLY_DIES_MID, "engine_error", 1),
    (Fault.SYNTH_DIES_SECOND, "engine_error", 1),
    (Fault.SYNTH_HANGS_SECOND, "engine_timeout", 1),
]
SPOKEN_FAULTS = [
    (Fault.TRANSCRIBE_RAISES, "engine_error"),
    (Fault.TRANSCRIBE_HANGS, "engine_timeout"),
]


server = server_process(
    {
        "pipeline.stage_timeout_s": str(STAGE_TIMEOUT_S),
        "pipeline.incremental": "false",  # the final transcript always asks the engine
        "transport.max_sessions": "4",
        "server.debug_endpoints": "true",
    },
    pipeline="tests.support.fault_pipeline:create",
    env=tone_env(SENTENCE_MS, sentences=2),
)


async def live_sessions(server: ServerProcess) -> dict[str, dict[str, Any]]:
    """The live sessions' figures, asked off the event loop (this loop's peers keep sending)."""
    debug = await asyncio.to_thread(server.debug_sessions)
    return {s["session_id"]: s for s in debug["live"]}


def loud_since(peer: ClientPeer, since: float) -> float:
    """Seconds of clearly audible audio the peer received after monotonic time ``since``."""
    frames = [pcm for t, pcm in peer.audio if t >= since]
    return loud_seconds(np.concatenate(frames) if frames else np.zeros(0, np.int16))


async def turn(peer: ClientPeer, text: str) -> tuple[int, float]:
    """Send typed ``text``; returns (events index, monotonic time) from before it was sent."""
    n, sent = len(peer.events), time.monotonic()
    peer.send({"type": "conversation.item.create", "text": text})
    return n, sent


async def assert_session_continues(peer: ClientPeer) -> None:
    n, sent = await turn(peer, "are you still there?")
    done = await peer.wait_event("response.done", timeout=15, after=n)
    assert done["status"] == "completed"
    await asyncio.sleep(0.3)  # the tail of the audio is on its way
    assert loud_since(peer, sent) >= 2 * SENTENCE_MS / 1000 - 0.2


async def test_engine_faults_fail_one_reply_of_one_session(
    server: ServerProcess, peers: list[Peer]
) -> None:
    started = time.monotonic()
    baseline = (await server.wait_sessions(0, 15))["tasks"]
    census = (await asyncio.to_thread(server.debug_sessions))[
        "tasks"
    ]  # what runs with no session: the reaper, HTTP
    assert census["SessionRegistry._reap_loop"] == 1 and sum(census.values()) <= baseline + 1
    victim = Peer(server.url, video=False)
    other = Peer(server.url, video=False)
    peers += [victim, other]
    await victim.connect()
    await other.connect()
    replies: list[str] = []
    stop = asyncio.Event()
    talker = asyncio.get_running_loop().create_task(keep_talking(other, replies, stop))
    outcomes: list[dict[str, Any]] = []
    try:
        for fault, code, heard in TEXT_FAULTS:
            n, sent = await turn(victim, FAULT_PREFIX + fault.value)
            error = await victim.wait_event("error", timeout=10, after=n)
            assert error["error"]["code"] == code, (fault, error)
            done = await victim.wait_event("response.done", timeout=10, after=n)
            assert done["status"] == "failed", fault
            await asyncio.sleep(0.3)
            # what was made before the failure still plays, nothing after it
            loud = loud_since(victim, sent)
            assert abs(loud - heard * SENTENCE_MS / 1000) <= 0.2, (fault, loud)
            outcomes.append({"fault": fault.value, "error": code, "heard_s": loud})
            await assert_session_continues(victim)
        for fault, code in SPOKEN_FAULTS:
            n, _ = await turn(victim, ARM_PREFIX + fault.value)
            armed = await victim.wait_event("response.done", timeout=10, after=n)
            assert armed["status"] == "completed"
            n = len(victim.events)
            victim.mic.play(np.concatenate([silence(300), speak("Hello there, can you hear me?")]))
            await victim.wait_event("input_audio_buffer.speech_stopped", timeout=15, after=n)
            error = await victim.wait_event("error", timeout=10, after=n)
            assert error["error"]["code"] == code, (fault, error)
            done = await victim.wait_event("response.done", timeout=10, after=n)
            assert done["status"] == "failed"
            kinds = [e["type"] for _, e in victim.events[n:]]
            assert "conversation.item.input_audio_transcription.completed" not in kinds
            outcomes.append({"fault": fault.value, "error": code})
            # the next spoken turn is transcribed and answered
            n = len(victim.events)
            victim.mic.play(np.concatenate([silence(300), speak("And now?")]))
            await victim.wait_event(
                "conversation.item.input_audio_transcription.completed", timeout=15, after=n
            )
            done = await victim.wait_event("response.done", timeout=15, after=n)
            assert done["status"] == "completed"
    finally:
        stop.set()
        await asyncio.wait_for(talker, within(30))
    live = await live_sessions(server)
    assert set(live) == {victim.session_id, other.session_id}
    # the other session never noticed: every reply completed, not one underrun
    assert replies and set(replies) == {"completed"}
    assert live[str(other.session_id)]["underruns"] == 0
    print(
        "faults:",
        json.dumps(
            {
                "injected": len(outcomes),
                "outcomes": outcomes,
                "other_replies": len(replies),
                "other_underruns": live[str(other.session_id)]["underruns"],
                "seconds": round(time.monotonic() - started, 1),
            }
        ),
    )
    for peer in list(peers):
        await peer.close()
        peers.remove(peer)
    await server.wait_settled(baseline, 15)  # no hung engine call is left behind


async def test_full_server_answers_503_while_its_sessions_play(peers: list[Peer]) -> None:
    started = time.monotonic()
    server = ServerProcess(
        {
            "pipeline.factory": TONE_PIPELINE,
            "transport.max_sessions": "2",
            "transport.session_rate_per_min": "0",  # the attempts all come from one address
            "server.debug_endpoints": "true",
        },
        env={"TONE_PIPELINE_MS": "1500", "TONE_PIPELINE_SENTENCES": "3"},
    ).start()
    try:
        a = Peer(server.url, video=False)
        b = Peer(server.url)  # one with video too
        peers += [a, b]
        await a.connect()
        await b.connect()
        marks = [await turn(p, "tell me a long story") for p in (a, b)]
        for peer, (n, _) in zip((a, b), marks, strict=True):
            await peer.wait_event("response.created", timeout=10, after=n)
        extra = Peer(server.url, video=False)
        with pytest.raises(RuntimeError, match="offer 503"):
            await extra.connect()
        offer = extra.pc.localDescription.sdp
        await extra.close()
        rejected = 1
        async with aiohttp.ClientSession() as http:
            for _ in range(10):
                async with http.post(
                    f"{server.url}/offer", json={"type": "offer", "sdp": offer}
                ) as resp:
                    assert resp.status == 503
                    assert resp.headers["Retry-After"] == "5"
                    assert (await resp.json())["code"] == "server_full"
                headers = {"Content-Type": "application/sdp"}
                async with http.post(f"{server.url}/whip", data=offer, headers=headers) as resp:
                    assert resp.status == 503
                    assert (await resp.json())["error"]
                rejected += 2
                await asyncio.sleep(0.1)
        for peer, (n, sent) in zip((a, b), marks, strict=True):
            done = await peer.wait_event("response.done", timeout=20, after=n)
            assert done["status"] == "completed"
            await asyncio.sleep(0.3)
            assert loud_since(peer, sent) >= 3 * 1.5 - 0.2  # the whole reply was heard
        live = await live_sessions(server)
        underruns = {sid[:8]: s["underruns"] for sid, s in live.items()}
        assert len(live) == 2 and set(underruns.values()) == {0}
        assert metric_value(server.metrics(), "avatar_sessions_rejected_total") == rejected
        # a slot that frees up is usable again
        await a.close()
        peers.remove(a)
        await server.wait_sessions(1, 15)
        late = Peer(server.url, video=False)
        peers.append(late)
        await late.connect()
        print(
            "max sessions:",
            json.dumps(
                {
                    "rejected": rejected,
                    "underruns": underruns,
                    "seconds": round(time.monotonic() - started, 1),
                }
            ),
        )
    finally:
        for peer in list(peers):
            await peer.close()
            peers.remove(peer)
        assert server.stop() == 0, server.log()
