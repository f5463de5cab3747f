"""``POST /v1/realtime/calls`` with the official ``openai`` package, and an aiortc call on the
``oai-events`` channel: a spoken exchange, a typed one and a barge-in, every server event
validated against the package's models (``RealtimeServerEvent``).

The server runs in this process with the real turn detector (webrtcvad + Silero) and a
deterministic reply pipeline whose first sentence repeats its instructions
(tests/support/tone_pipeline.py); the question is spoken by espeak-ng.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc import RTCSessionDescription
from openai import AsyncOpenAI, AuthenticationError, BadRequestError
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from client.cli import GA_EVENTS
from server.config import Config
from server.http.signaling import REGISTRY_KEY
from tests.support.in_process import running
from tests.support.pace import within
from tests.support.peers import Peer
from tests.support.speech import silence, speak
from tests.support.tone_pipeline import InstructedTonePipeline

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

TOKEN_A = "token-a-0123456789abcdef"
TOKEN_B = "token-b-0123456789abcdef"
SETTINGS = {"server.auth_tokens": f"{TOKEN_A},{TOKEN_B}"}
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
INSTRUCTIONS = "You are the voice of the harbour museum."


def pipeline(config: Config) -> InstructedTonePipeline:
    return InstructedTonePipeline(1200.0, 2)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def call(peer: Peer, client: AsyncOpenAI, session: dict[str, Any] | None = None) -> str:
    """The peer's offer through ``client.realtime.calls.create``; the call's Location."""
    peer.pc.addTrack(peer.mic)
    await peer.pc.setLocalDescription(await peer.pc.createOffer())
    extra: dict[str, Any] = {} if session is None else {"session": session}
    answer = await client.realtime.calls.create(sdp=peer.pc.localDescription.sdp, **extra)
    assert answer.response.status_code == 201
    assert answer.response.headers["Content-Type"].startswith("application/sdp")
    location = answer.response.headers["Location"]
    await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
    await asyncio.wait_for(peer.channel_open.wait(), within(15))
    return str(location)


def checked(events: list[dict[str, Any]]) -> Counter[str]:
    """Every GA event validated by the openai package (0 invalid); the others are
    ``x-avatar.*`` extensions. Returns the GA events counted by type."""
    counts: Counter[str] = Counter()
    for event in events:
        if event["type"].startswith("x-avatar."):
            assert event.get("event_id"), event
            continue
        assert SERVER_EVENT.validate_python(event).type == event["type"]
        counts[event["type"]] += 1
    return counts


def since(peer: Peer, n: int, kind: str) -> list[dict[str, Any]]:
    return [e for _, e in peer.events[n:] if e["type"] == kind]


async def test_the_openai_client_calls_and_every_event_validates(peers: list[Peer]) -> None:
    async with running(SETTINGS, pipeline=pipeline) as (url, app):
        client = AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN_A, max_retries=0)
        peer = Peer(url, video=False, events_label=GA_EVENTS)
        peers.append(peer)
        location = await call(peer, client, {"type": "realtime", "instructions": INSTRUCTIONS})
        assert location.startswith("/v1/realtime/calls/")
        created = await peer.wait_event("session.created")
        assert created["session"]["instructions"] == INSTRUCTIONS
        # spoken
        question = speak("What time does the museum open?")
        peer.mic.play(np.concatenate([silence(300), question, silence(300)]))
        heard = await peer.wait_event("conversation.item.input_audio_transcription.completed", 30)
        assert heard["transcript"].startswith("utterance of")
        spoken = await peer.wait_event("response.done", 30)
        assert spoken["response"]["status"] == "completed"
        transcript = spoken["response"]["output"][0]["content"][0]["transcript"]
        assert transcript.startswith("As told: " + INSTRUCTIONS[:20])  # the session's instructions
        # typed: an item, then one response
        n = len(peer.events)
        peer.say("And when does it close?")
        typed = await peer.wait_event("response.done", 30, after=n)
        assert typed["response"]["status"] == "completed"
        assert len(since(peer, n, "response.created")) == 1
        assert since(peer, n, "conversation.item.added")[0]["item"]["role"] == "user"
        # a barge-in: the user talks over the reply
        n = len(peer.events)
        peer.say("Tell me about the ships.")
        started = await peer.wait_event("output_audio_buffer.started", 30, after=n)
        await asyncio.sleep(0.4)
        peer.mic.play(speak("Wait, stop please."))
        cleared = await peer.wait_event("output_audio_buffer.cleared", 30, after=n)
        assert cleared["response_id"] == started["response_id"]
        cut = await peer.wait_event("response.done", 30, after=n)
        assert cut["response"]["status"] == "cancelled"
        truncated = since(peer, n, "conversation.item.truncated")[0]
        assert truncated["item_id"] == cut["response"]["output"][0]["id"]
        assert truncated["audio_end_ms"] > 0
        await peer.wait_event("response.done", 30, after=len(peer.events))  # its answer
        counts = checked([e for _, e in peer.events])
        extensions = Counter(e["type"] for _, e in peer.events if e["type"].startswith("x-avatar."))
        print(
            f"\nvalidated {sum(counts.values())} GA events of {len(counts)} types (0 invalid); "
            f"{sum(extensions.values())} extension events of {len(extensions)} types"
        )
        assert len(counts) >= 20
        # the call ends with DELETE of its Location, by its creator only
        async with aiohttp.ClientSession() as http:
            async with http.delete(url + location) as resp:
                assert resp.status == 401
            async with http.delete(url + location, headers=bearer(TOKEN_B)) as resp:
                assert resp.status == 403
                body = await resp.json()
                assert body["error"]["type"] == "invalid_request_error"
            async with http.delete(url + location, headers=bearer(TOKEN_A)) as resp:
                assert resp.status == 200
        assert len(app[REGISTRY_KEY]) == 0
        peer.location = None


async def test_the_plain_sdp_form_and_refusals(peers: list[Peer]) -> None:
    async with running(SETTINGS, pipeline=pipeline) as (url, app):
        peer = Peer(url, video=False, events_label=GA_EVENTS)
        peers.append(peer)
        peer.pc.addTrack(peer.mic)
        await peer.pc.setLocalDescription(await peer.pc.createOffer())
        offer = peer.pc.localDescription.sdp
        client = AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN_A, max_retries=0)
        with pytest.raises(BadRequestError, match="tools"):
            await client.realtime.calls.create(
                sdp=offer,
                session={"type": "realtime", "tools": [{"type": "mcp", "server_label": "f"}]},
            )
        stranger = AsyncOpenAI(base_url=url + "/v1", api_key="not-a-token", max_retries=0)
        with pytest.raises(AuthenticationError):
            await stranger.realtime.calls.create(sdp=offer)
        assert len(app[REGISTRY_KEY]) == 0  # nothing was created by a refused call
        headers = {"Content-Type": "application/sdp", **bearer(TOKEN_B)}
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/v1/realtime/calls", data=offer, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
                location = resp.headers["Location"]
                answer = await resp.text()
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await asyncio.wait_for(peer.channel_open.wait(), within(15))
            await peer.wait_event("session.created")
            content = [{"type": "input_text", "text": "Hello?"}]
            item = {"type": "message", "role": "user", "content": content}
            peer.send({"type": "conversation.item.create", "item": item})
            peer.send(
                {"type": "response.create", "response": {"instructions": "Speak as a robot."}}
            )
            done = await peer.wait_event("response.done", 30)
            said = done["response"]["output"][0]["content"][0]["transcript"]
            assert said.startswith("As told: Speak as a robot.")
            async with http.post(url + location + "/hangup", headers=bearer(TOKEN_B)) as resp:
                assert resp.status == 200
        assert len(app[REGISTRY_KEY]) == 0
        checked([e for _, e in peer.events])
        peer.location = None


def test_the_session_field_is_read_as_json() -> None:
    from server.http.realtime_calls import session_patch

    patch = session_patch(json.dumps({"type": "realtime", "instructions": "Be brief."}))
    assert patch.conditions == {"persona": "Be brief."}
