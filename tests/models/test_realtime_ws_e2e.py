"""The OpenAI Realtime WebSocket on the embedded models: the ``openai`` package's own
``client.realtime.connect()`` asks a spoken question (the project's voice, PCM16 at 24 kHz
appended in 40 ms pieces at real time), and the reply's audio deltas, decoded and heard by
Whisper, are speech of the reply's transcript. Every server event is validated by the
package's models (tests/server/http/test_realtime_ws.py's Listener)."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import numpy.typing as npt
import pytest
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from models.asr import WhisperAsr
from models.tts import OnnxVoiceTts
from server.pipeline.resample import resample
from tests.models.test_voice_e2e import cer
from tests.server.http.test_realtime_ws import Listener
from tests.support.server_process import ServerProcess, server_process
from tests.support.speech import silence

pytestmark = pytest.mark.timeout(600)

TOKEN = "token-ws-models-0123456789"
PIECE_MS = 40  # audio per append, as a microphone sends it

server = server_process(
    {"server.auth_tokens": TOKEN, "transport.video": "false"}, timeout=400, log_tail=3000
)


async def speak_into(connection: AsyncRealtimeConnection, pcm24: npt.NDArray[np.int16]) -> None:
    """``pcm24`` appended in PIECE_MS pieces at real time."""
    append = connection.input_audio_buffer.append
    step = 24 * PIECE_MS
    started = time.monotonic()
    for i, start in enumerate(range(0, len(pcm24), step)):
        piece = pcm24[start : start + step].astype("<i2").tobytes()
        await append(audio=base64.b64encode(piece).decode())
        await asyncio.sleep(max(0.0, started + (i + 1) * PIECE_MS / 1000 - time.monotonic()))


async def test_a_spoken_question_over_the_websocket_gets_a_spoken_answer(
    server: ServerProcess,
) -> None:
    tts, asr = OnnxVoiceTts(), WhisperAsr()
    question = tts.synthesize("What is the capital of France?").pcm  # 48 kHz
    spoken = resample(np.concatenate([silence(300), question, silence(1500)]), 48_000, 24_000)
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        listener = Listener(connection)
        try:
            await listener.wait("session.created", 30)
            await speak_into(connection, spoken)
            heard = await listener.wait("conversation.item.input_audio_transcription.completed", 60)
            assert "capital" in heard["transcript"].lower()
            assert "france" in heard["transcript"].lower()
            done = await listener.wait("response.done", 120)
            assert done["response"]["status"] == "completed"
            said = await listener.wait("response.output_audio_transcript.done", 5)
            reply = listener.pcm(said["item_id"])  # PCM16 24 kHz, as the client plays it
        finally:
            await listener.close()
    assert len(reply) > 24_000 * 0.5, "less than half a second of reply audio"
    recognised = await asyncio.to_thread(asr.transcribe, resample(reply, 24_000, 16_000))
    assert cer(said["transcript"], recognised) <= 0.25, (said["transcript"], recognised)
