"""``GET /v1/realtime`` (OpenAI Realtime over a WebSocket) with the official ``openai``
package's own client (``client.realtime.connect()``): a typed turn, a spoken one appended as
PCM16 at 24 kHz in 40 ms pieces, a barge-in the client hears as ``speech_started`` and answers
with ``conversation.item.truncate``, every server event validated by the package's models
(``RealtimeServerEvent``), bad input, authentication and closing.

The server runs in this process with the real turn detector (webrtcvad + Silero) and a
deterministic reply pipeline of tones (tests/support/tone_pipeline.py); questions are spoken
by espeak-ng.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
import pytest
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.exceptions import InvalidStatus

from server.config import Config
from server.http.signaling import REGISTRY_KEY
from server.pipeline.resample import resample
from tests.support.in_process import running
from tests.support.pace import within
from tests.support.speech import rms, silence, speak
from tests.support.tone_pipeline import InstructedTonePipeline

TOKEN = "token-ws-0123456789abcdef"
SETTINGS = {"server.auth_tokens": TOKEN}
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
PIECE_MS = 40  # audio per append
SENTENCE_MS = 1200.0


def pipeline(config: Config) -> InstructedTonePipeline:
    return InstructedTonePipeline(SENTENCE_MS, 2)


def pcm24(pcm48: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    return resample(pcm48, 48_000, 24_000)


class Listener:
    """The client side: every server event, validated as it comes, and the reply audio."""

    def __init__(self, connection: AsyncRealtimeConnection) -> None:
        self.connection = connection
        self.events: list[dict[str, Any]] = []
        self.arrived: list[float] = []  # time.monotonic() of each event
        self.audio: dict[str, list[bytes]] = {}  # item id -> PCM16 24 kHz pieces
        self._new = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            while True:
                raw = await self.connection.recv_bytes()
                event = json.loads(raw)
                typed = self.connection.parse_event(raw)  # the package's own parse
                assert typed.type == event["type"]
                if not event["type"].startswith("x-avatar."):
                    assert SERVER_EVENT.validate_python(event).type == event["type"], event
                assert event.get("event_id"), event
                if event["type"] == "response.output_audio.delta":
                    self.audio.setdefault(event["item_id"], []).append(
                        base64.b64decode(event["delta"])
                    )
                self.events.append(event)
                self.arrived.append(time.monotonic())
                self._new.set()

    async def wait(self, kind: str, seconds: float = 30, after: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + within(seconds)
        while True:
            for event in self.events[after:]:
                if event["type"] == kind:
                    return event
            left = deadline - time.monotonic()
            if left <= 0:
                kinds = [e["type"] for e in self.events[after:]]
                raise AssertionError(f"no {kind} within {seconds} s; got {kinds}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    def since(self, after: int, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events[after:] if e["type"] == kind]

    def pcm(self, item_id: str) -> npt.NDArray[np.int16]:
        return np.frombuffer(b"".join(self.audio.get(item_id, [])), "<i2").astype(np.int16)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def append(connection: AsyncRealtimeConnection, pcm: npt.NDArray[np.int16]) -> None:
    """``pcm`` (24 kHz) appended in PIECE_MS pieces at real time."""
    step = 24 * PIECE_MS
    started = time.monotonic()
    for i, start in enumerate(range(0, len(pcm), step)):
        piece = pcm[start : start + step].astype("<i2").tobytes()
        await connection.input_audio_buffer.append(audio=base64.b64encode(piece).decode())
        await asyncio.sleep(max(0.0, started + (i + 1) * PIECE_MS / 1000 - time.monotonic()))


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[tuple[AsyncRealtimeConnection, Listener]]:
    client = AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        listener = Listener(connection)
        try:
            yield connection, listener
        finally:
            await listener.close()


async def test_typed_spoken_and_interrupted_turns_with_the_openai_client() -> None:
    async with running(SETTINGS, pipeline=pipeline) as (url, app):
        async with connected(url) as (connection, heard):
            created = await heard.wait("session.created")
            assert heard.events[0] is created  # session.created first
            assert created["session"]["audio"]["input"]["format"]["rate"] == 24_000
            await connection.session.update(
                session={"type": "realtime", "instructions": "You guide the harbour museum."}
            )
            await heard.wait("session.updated")
            # typed: an item, then a response with audio deltas
            n = len(heard.events)
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "When does the museum open?"}]}
            )  # fmt: skip
            await connection.response.create()
            typed = await heard.wait("response.done", after=n)
            assert typed["response"]["status"] == "completed"
            item_id = typed["response"]["output"][0]["id"]
            reply = heard.pcm(item_id)
            seconds = len(reply) / 24_000
            assert 2.0 * SENTENCE_MS / 1000 < seconds < 3.0 * SENTENCE_MS / 1000 + 1.0
            assert rms(reply) > 1000  # the tones, not silence
            deltas = heard.since(n, "response.output_audio.delta")
            kinds = [e["type"] for e in heard.events[n:]]
            assert kinds.index("response.content_part.added") < kinds.index(
                "response.output_audio.delta"
            )
            assert kinds.index("response.output_audio.done") > len(kinds) - 1 - kinds[::-1].index(
                "response.output_audio.delta"
            )
            assert {(d["response_id"], d["item_id"]) for d in deltas} == {
                (typed["response"]["id"], item_id)
            }
            # spoken: PCM16 at 24 kHz appended at real time; server VAD ends the turn
            n = len(heard.events)
            question = speak("What time does the museum open?")
            await append(connection, pcm24(np.concatenate([silence(300), question])))
            await heard.wait("input_audio_buffer.speech_started", after=n)
            await append(connection, pcm24(silence(1500)))
            await heard.wait("input_audio_buffer.speech_stopped", after=n)
            said = await heard.wait("conversation.item.input_audio_transcription.completed", 30, n)
            assert said["transcript"].startswith("utterance of")
            spoken = await heard.wait("response.done", after=n)
            assert spoken["response"]["status"] == "completed"
            assert rms(heard.pcm(spoken["response"]["output"][0]["id"])) > 1000
            # interrupted: speech over the reply's audio; the client stops at speech_started
            # and truncates to what it played
            n = len(heard.events)
            await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Tell me about the ships."}]}
            )  # fmt: skip
            await connection.response.create()
            first = await heard.wait("response.output_audio.delta", after=n)
            first_at = heard.arrived[heard.events.index(first)]
            reply_id = first["item_id"]
            await asyncio.sleep(0.8)
            m = len(heard.events)
            talking = asyncio.create_task(append(connection, pcm24(speak("Wait, stop please."))))
            started = await heard.wait("input_audio_buffer.speech_started", after=m)
            played_ms = min(
                (time.monotonic() - first_at) * 1000, len(heard.pcm(reply_id)) / 24
            )  # the client played from the first delta on, as it came
            await connection.conversation.item.truncate(
                item_id=reply_id, content_index=0, audio_end_ms=int(played_ms)
            )
            await talking
            await append(connection, pcm24(silence(1500)))
            cut = await heard.wait("response.done", after=m)
            assert cut["response"]["status"] == "cancelled"
            truncated = heard.since(m, "conversation.item.truncated")
            assert {e["item_id"] for e in truncated} == {reply_id}  # the answer is not cut
            assert truncated[-1]["audio_end_ms"] == int(played_ms)
            assert started["audio_start_ms"] >= 0
            answer = await heard.wait("response.done", after=heard.events.index(cut) + 1)
            assert answer["response"]["status"] == "completed"  # the interjection is answered
            # the history keeps only what the client played
            r = len(heard.events)
            await connection.conversation.item.retrieve(item_id=reply_id)
            kept = (await heard.wait("conversation.item.retrieved", after=r))["item"]
            written = next(
                e for e in heard.since(m, "response.output_audio_transcript.done")
                if e["item_id"] == reply_id
            )["transcript"]  # fmt: skip
            kept_text = kept["content"][0]["transcript"]
            assert kept["status"] == "incomplete"
            assert len(kept_text.split()) < len(written.split())
            assert written.startswith(kept_text)
            first = next(
                e for e in heard.since(n, "response.output_audio_transcript.delta")
                if e["item_id"] == reply_id
            )["delta"]  # fmt: skip
            words_ms = SENTENCE_MS / len(first.split())  # the tone pipeline: evenly spaced words
            assert len(kept_text.split()) <= played_ms / words_ms + 1
            counts = {e["type"] for e in heard.events}
            print(
                f"\n{len(heard.events)} events of {len(counts)} types validated; "
                f"interruption heard {played_ms:.0f} ms in, kept {kept_text!r}"
            )
        await asyncio.sleep(0.2)
        assert len(app[REGISTRY_KEY]) == 0  # the socket closed: the session ended


async def test_bad_input_gets_an_error_and_changes_nothing() -> None:
    async with (
        running(SETTINGS, pipeline=pipeline) as (url, _),
        connected(url) as (
            connection,
            heard,
        ),
    ):
        await heard.wait("session.created")
        n = len(heard.events)
        await connection.send({"type": "input_audio_buffer.append", "audio": "not base64!"})
        big = base64.b64encode(bytes(60_000)).decode()
        await connection.send({"type": "input_audio_buffer.append", "audio": big})
        await connection.send({"type": "conversation.item.frobnicate", "event_id": "e1"})  # type: ignore[arg-type]
        odd = base64.b64encode(bytes(3)).decode()
        await connection.send({"type": "input_audio_buffer.append", "audio": odd})
        await connection.session.update(
            session={"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}}
        )
        await connection.input_audio_buffer.commit()
        for _ in range(6):
            await heard.wait("error", after=n)
            n = heard.events.index(heard.since(n, "error")[0]) + 1
        errors = [e["error"] for e in heard.events if e["type"] == "error"]
        assert [e["code"] for e in errors] == [
            "invalid_value",
            "invalid_value",
            "unknown_event",
            "invalid_value",
            "unsupported_feature",
            "input_audio_buffer_commit_empty",
        ]
        assert errors[2]["event_id"] == "e1"
        await asyncio.sleep(0.3)
        kinds = {e["type"] for e in heard.events}
        assert kinds == {"session.created", "x-avatar.session", "error"}  # nothing else
        # and the session still works
        await connection.conversation.item.create(
                item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Hello?"}]}
            )  # fmt: skip
        await connection.response.create()
        done = await heard.wait("response.done")
        assert done["response"]["status"] == "completed"


async def test_who_may_connect_and_closing() -> None:
    async with running({**SETTINGS, "server.cors_origins": "https://app.example"}) as (url, app):
        stranger = AsyncOpenAI(base_url=url + "/v1", api_key="not-a-token", max_retries=0)
        with pytest.raises(InvalidStatus) as refused:
            async with stranger.realtime.connect(model="gpt-realtime"):
                pass
        assert refused.value.response.status_code == 401
        ws_url = url.replace("http", "ws") + "/v1/realtime?model=gpt-realtime"
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as bad:
                await http.ws_connect(ws_url)  # no token at all
            assert bad.value.status == 401
            key = f"openai-insecure-api-key.{TOKEN}"
            protocols = ("realtime", key, "openai-beta.realtime-v1")
            with pytest.raises(aiohttp.WSServerHandshakeError) as foreign:
                await http.ws_connect(
                    ws_url, protocols=protocols, headers={"Origin": "https://evil.example"}
                )
            assert foreign.value.status == 403
            assert len(app[REGISTRY_KEY]) == 0
            # a browser: the key as a subprotocol, from an allowed origin
            ws = await http.ws_connect(
                ws_url, protocols=protocols, headers={"Origin": "https://app.example"}
            )
            assert ws.protocol == "realtime"
            first = await ws.receive_json(timeout=within(10))
            assert first["type"] == "session.created"
            assert app[REGISTRY_KEY].live == 1
            await ws.close()
            await asyncio.sleep(0.3)
            assert len(app[REGISTRY_KEY]) == 0  # closed by the client: ended
            # the server shuts down: its sockets close with 1001
            ws = await http.ws_connect(ws_url, headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.receive_json(timeout=within(10))

            async def closed() -> aiohttp.WSMsgType:
                while True:
                    message = await ws.receive(timeout=within(20))
                    if message.type is not aiohttp.WSMsgType.TEXT:
                        return message.type

            closing = asyncio.create_task(closed())
            await asyncio.sleep(0.1)
            registry = app[REGISTRY_KEY]
            await app.shutdown()  # what the runner does first when it stops
            assert await closing in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == 1001
            await asyncio.sleep(0.3)
            assert len(registry) == 0
