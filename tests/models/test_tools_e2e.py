"""Function calling on the embedded models, as an app built on the ``openai`` package uses it
over the WebSocket (``client.realtime.connect()``): the session's tools, a typed request, the
model's call (its arguments held to the tool's schema), the client's output, and the spoken
answer made from it, heard by Whisper. Every server event is validated by the package's models
(tests/server/http/test_realtime_ws.py's Listener)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from models.asr import WhisperAsr
from server.pipeline.resample import resample
from tests.models.test_voice_e2e import cer
from tests.server.http.test_realtime_ws import Listener
from tests.support.server_process import ServerProcess, server_process

pytestmark = pytest.mark.timeout(600)

TOKEN = "token-tools-models-0123456789"
LAMP: Any = {
    "type": "function",
    "name": "set_lamp",
    "description": "Set the colour of the lamp in the room, or switch it off.",
    "parameters": {
        "type": "object",
        "properties": {
            "color": {"type": "string", "enum": ["red", "green", "blue", "white", "off"]}
        },
        "required": ["color"],
    },
}
CLOCK: Any = {
    "type": "function",
    "name": "get_time",
    "description": "Tell the current local time.",
    "parameters": {"type": "object", "properties": {}},
}

server = server_process(
    {"server.auth_tokens": TOKEN, "transport.video": "false"}, timeout=400, log_tail=3000
)


async def ask(connection: AsyncRealtimeConnection, text: str) -> float:
    """A typed user message and ``response.create``; when they were sent (monotonic s)."""
    content = [{"type": "input_text", "text": text}]
    item: Any = {"type": "message", "role": "user", "content": content}
    await connection.conversation.item.create(item=item)
    await connection.response.create()
    return time.monotonic()


async def test_the_model_calls_the_tool_and_speaks_from_its_output(
    server: ServerProcess,
) -> None:
    asr = WhisperAsr()
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        listener = Listener(connection)
        try:
            await listener.wait("session.created", 30)
            await connection.session.update(session={"type": "realtime", "tools": [LAMP, CLOCK]})
            await listener.wait("session.updated", 30)

            n = len(listener.events)
            asked = await ask(connection, "Please turn the lamp red.")
            args = await listener.wait("response.function_call_arguments.done", 120, n)
            call_ms = (time.monotonic() - asked) * 1000
            assert args["name"] == "set_lamp"
            assert json.loads(args["arguments"]) == {"color": "red"}
            done = await listener.wait("response.done", 60, n)
            assert done["response"]["status"] == "completed"
            calls = [o for o in done["response"]["output"] if o["type"] == "function_call"]
            assert [c["call_id"] for c in calls] == [args["call_id"]]

            item: Any = {
                "type": "function_call_output",
                "call_id": args["call_id"],
                "output": json.dumps({"lamp": "red", "ok": True}),
            }
            n = len(listener.events)
            await connection.conversation.item.create(item=item)
            await connection.response.create()
            answered = time.monotonic()
            audio = await listener.wait("response.output_audio.delta", 120, n)
            first_audio_ms = (time.monotonic() - answered) * 1000
            spoken = await listener.wait("response.done", 120, n)
            assert spoken["response"]["status"] == "completed"
            said = await listener.wait("response.output_audio_transcript.done", 5, n)
            reply = listener.pcm(audio["item_id"])
        finally:
            await listener.close()
    assert said["transcript"].strip(), "the answer said nothing"
    assert len(reply) > 24_000 * 0.3, "less than 0.3 s of reply audio"
    heard = await asyncio.to_thread(asr.transcribe, resample(reply, 24_000, 16_000))
    assert cer(said["transcript"], heard) <= 0.3, (said["transcript"], heard)
    print(
        f"\nrequest -> arguments.done {call_ms:.0f} ms; output -> first audio delta "
        f"{first_audio_ms:.0f} ms; answer: {said['transcript']!r}"
    )
