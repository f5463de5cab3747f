"""Incremental prefill at the peer level: a real aiortc peer speaks (espeak-ng) to the real
server app in this process (real VAD, real partial loop), whose reply pipeline is the real
:class:`~server.pipeline.voice.VoicePipeline`
on recording stand-in engines: a scripted recogniser (one
more word of the question per 150 ms of audio heard), an LLM that records every call, and a
TTS that answers with a short tone.

While the user speaks, the partial loop must warm the LLM with the latest partial's words, the
user turn left open (``prefill_open``), and at the pause before the endpoint with the whole
partial; the reply's prompt must extend every warm-up's prompt token for token under the
embedded model's tokenizer and chat template, in the same cache scope.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from models.llm import ChatPrompts, Message
from models.prepare import prepare_llm
from models.tts import split_sentences
from server.config import load_config
from server.http.app import create_app
from server.pipeline.voice import VoicePipeline
from server.pipeline.wiring import detector_factory
from tests.support.peers import Peer
from tests.support.speech import silence, speak
from tests.support.tone_pipeline import tone

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.usefixtures("client_ice"), pytest.mark.timeout(120)]

QUESTION = (
    "Tell me about the history of the old city by the river, and which of its buildings I"
    " should visit first on a short trip"
)
WORD_MS = 150  # the scripted recogniser hears one more word per 150 ms of audio


class ScriptedAsr:
    """The question's first words, as many as the audio heard allows; records the prefixes
    (stable words) the peer asked it to continue from."""

    def __init__(self, mark: str = "") -> None:
        self.prefixes: list[str] = []
        self.called_at: list[float] = []  # time.monotonic() of each call
        self.mark = mark  # written after the question's last word

    def transcribe(self, pcm: npt.NDArray[np.int16], prefix: str = "") -> str:
        self.prefixes.append(prefix)
        self.called_at.append(time.monotonic())
        words = QUESTION.split()
        heard = min(len(words), int(len(pcm) / 16 // WORD_MS))
        return " ".join(words[:heard]) + (self.mark if heard == len(words) else "")


@dataclass(frozen=True)
class Call:
    kind: str  # "prefill_open", "prefill" or "stream"
    messages: list[Message]
    salt: str | None
    at: float = field(default_factory=time.monotonic)


class RecordingLlm:
    """Records every call; writes a two-sentence reply."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    async def prefill_open(
        self,
        messages: Sequence[Message],
        request_id: str,
        *,
        cache_salt: str | None = None,
        paused: bool = False,
    ) -> Any:
        self.calls.append(Call("prefill_open", [dict(m) for m in messages], cache_salt))
        return SimpleNamespace(cached_tokens=0)

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> Any:
        self.calls.append(Call("prefill", [dict(m) for m in messages], cache_salt))
        return SimpleNamespace(cached_tokens=0)

    async def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncIterator[str]:
        self.calls.append(Call("stream", [dict(m) for m in messages], cache_salt))
        for piece in ("It is very old. ", "Visit the cathedral first."):
            yield piece

    async def abort(self, request_id: str) -> None:
        pass

    def last_stats(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        pass


class SlowWarmUpLlm(RecordingLlm):
    """A warm-up of the open turn takes WARM_S (an LLM busy with other sessions); records when
    each one began and ended (ended: done or cancelled)."""

    WARM_S = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.warm_ups: list[tuple[float, float]] = []

    async def prefill_open(
        self,
        messages: Sequence[Message],
        request_id: str,
        *,
        cache_salt: str | None = None,
        paused: bool = False,
    ) -> Any:
        began = time.monotonic()
        try:
            await asyncio.sleep(self.WARM_S)
            return await super().prefill_open(
                messages, request_id, cache_salt=cache_salt, paused=paused
            )
        finally:
            self.warm_ups.append((began, time.monotonic()))


class ToneTts:
    def synthesize(self, text: str) -> Any:
        return SimpleNamespace(pcm=tone(300), words=(), phonemes=())


@pytest.fixture(scope="module")
def prompts() -> ChatPrompts:
    from transformers import AutoTokenizer

    return ChatPrompts(AutoTokenizer.from_pretrained(str(prepare_llm())))


@contextlib.asynccontextmanager
async def serving(
    llm: RecordingLlm, asr: ScriptedAsr | None = None, settings: dict[str, str] | None = None
) -> AsyncIterator[tuple[str, RecordingLlm, ScriptedAsr]]:
    """The real app on loopback (with ``settings``), its voice pipeline on ``llm``, the
    scripted ASR (``asr``, or one that writes no final mark) and a tone TTS."""
    config = load_config(
        overrides={
            "transport.video": "false",
            "transport.ice_host_addresses": "127.0.0.1",
            "pipeline.incremental": "true",
            "pipeline.partial_interval_ms": "200",
            **(settings or {}),
        }
    )
    asr = asr or ScriptedAsr()
    pipeline = VoicePipeline(
        asr, llm, ToneTts(), split_sentences, max_tokens=20, first_chunk_words=6
    )
    app = create_app(config, detector_factory(config), pipeline)
    site = TestServer(app, host="127.0.0.1")
    await site.start_server()
    try:
        yield f"http://127.0.0.1:{site.port}", llm, asr
    finally:
        await site.close()
        await pipeline.close()


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[str, RecordingLlm, ScriptedAsr]]:
    async with serving(RecordingLlm()) as served:
        yield served


def _words(messages: list[Message]) -> str:
    assert messages[-1]["role"] == "user"
    return str(messages[-1]["content"])


async def asking(url: str, peers: list[Peer], quiet_ms: int = 300) -> Peer:
    """A peer that connected and asks QUESTION, then is quiet for ``quiet_ms``."""
    peer = Peer(url, video=False)
    peers.append(peer)
    await peer.connect()
    peer.mic.play(np.concatenate([silence(500), speak(QUESTION), silence(quiet_ms)]))
    return peer


async def stopped_at(peer: Peer) -> float:
    """When (``time.monotonic()``) the server's speech_stopped event reached ``peer``."""
    stopped = await peer.wait_event("input_audio_buffer.speech_stopped", timeout=30)
    return next(t for t, e in peer.events if e is stopped)


async def answered(peer: Peer, transcript: str = QUESTION) -> None:
    """The reply to ``transcript`` (the final transcript) played to its end."""
    done = await peer.wait_event("response.done", timeout=30)
    assert done["status"] == "completed"
    final = await peer.wait_event("conversation.item.input_audio_transcription.completed")
    assert final["transcript"] == transcript


async def test_the_partial_loop_warms_the_prompt_the_reply_extends(
    server: tuple[str, RecordingLlm, ScriptedAsr], peers: list[Peer], prompts: ChatPrompts
) -> None:
    url, llm, asr = server
    peer = await asking(url, peers)
    stopped = await stopped_at(peer)
    await answered(peer)

    warm_ups = [c for c in llm.calls if c.kind == "prefill_open"]
    (reply,) = [c for c in llm.calls if c.kind == "stream"]
    # the persona was warmed when the session started, alone, in the reply's cache scope
    assert [c.kind for c in llm.calls if c.kind != "prefill_open"] == ["prefill", "stream"]
    (persona,) = [c for c in llm.calls if c.kind == "prefill"]
    assert [m["role"] for m in persona.messages] == ["system"] and persona.salt == reply.salt
    assert llm.calls.index(persona) < llm.calls.index(warm_ups[0])
    assert len(warm_ups) >= 3, llm.calls
    # while the user spoke (before the endpoint's event left the server), before the reply
    assert all(c.at < stopped for c in warm_ups)
    assert llm.calls.index(reply) > llm.calls.index(warm_ups[-1])
    # each warm-up holds a partial's words the peer was told of, growing with the speech; the
    # last one the whole partial decoded in the pause before the endpoint, the final transcript
    delta = "conversation.item.input_audio_transcription.delta"
    partials = {e["transcript"].strip() for _, e in peer.events if e.get("type") == delta}
    stable = {e["stable"] for _, e in peer.events if e.get("type") == delta}
    said = [_words(c.messages) for c in warm_ups]
    *growing, heard_all = said
    assert heard_all == QUESTION
    assert set(growing) <= partials and said == sorted(said, key=len)
    assert len(growing[-1].split()) >= len(QUESTION.split()) // 2
    assert set(asr.prefixes) <= stable | {""}  # the recogniser continued from the stable words
    # the reply's prompt extends every warm-up's, token for token, in the same cache scope
    reply_ids = prompts.render(reply.messages)
    assert _words(reply.messages) == QUESTION
    for call in warm_ups:
        assert call.salt == reply.salt is not None
        assert QUESTION.startswith(_words(call.messages))
        ids = prompts.render_open(call.messages)
        assert reply_ids[: len(ids)] == ids and len(ids) < len(reply_ids)
    last = prompts.render_open(warm_ups[-1].messages)
    log.warning(
        "warm-ups %s; reply prompt %d tokens, the last warm-up's %d",
        said,
        len(reply_ids),
        len(last),
    )
    assert len(last) > len(prompts.render_open(warm_ups[0].messages))


def test_the_stand_in_asr_continues_from_its_prefix() -> None:
    asr = ScriptedAsr()
    second = np.zeros(16_000, np.int16)
    assert asr.transcribe(second) == " ".join(QUESTION.split()[:6])
    assert asr.transcribe(np.zeros(160_000, np.int16), prefix="Tell me") == QUESTION


async def test_the_recogniser_keeps_decoding_while_a_warm_up_runs(peers: list[Peer]) -> None:
    """A slow warm-up must not hold the partial loop: the decode at the speaker's pause is the
    final transcript, and waiting for the LLM would leave the endpoint to decode it again."""
    llm = SlowWarmUpLlm()
    async with serving(llm) as (url, _, asr):
        peer = await asking(url, peers)
        await answered(peer)
        await peer.close()
    assert llm.warm_ups, "no warm-up began"
    during = [t for t in asr.called_at if any(a < t < b for a, b in llm.warm_ups)]
    log.warning(
        "%d warm-ups of %.1f s; %d of %d decodes ran during one",
        len(llm.warm_ups),
        llm.WARM_S,
        len(during),
        len(asr.called_at),
    )
    assert len(during) >= 2, (llm.warm_ups, asr.called_at)


async def test_a_pause_before_the_endpoint_begins_the_reply_the_endpoint_plays(
    peers: list[Peer],
) -> None:
    """The pause's words end a sentence, and the turn ends only after the fixed silence (no
    end-of-turn model): the reply to them begins at the pause, before the endpoint, and the
    endpoint adopts it (server/conversation/early.py). One LLM stream, begun before the
    server said the speech stopped, on the final transcript's prompt."""
    llm = RecordingLlm()
    settings = {"vad.semantic": "false"}
    async with serving(llm, ScriptedAsr(mark="."), settings) as (url, _, _asr):
        peer = await asking(url, peers, quiet_ms=1200)
        stopped = await stopped_at(peer)
        timings = await peer.wait_event("response.timings", timeout=30)
        await answered(peer, QUESTION + ".")
        await peer.close()
    (reply,) = [c for c in llm.calls if c.kind == "stream"]
    assert reply.at < stopped and _words(reply.messages) == QUESTION + "."
    assert timings["early_reply"] is True
    assert timings["llm_first_token_ms"] == 0.0 and timings["first_tts_ms"] == 0.0
    # no warm-up after it: it read the pause's words itself
    assert all(c.at < reply.at for c in llm.calls if c.kind == "prefill_open")
