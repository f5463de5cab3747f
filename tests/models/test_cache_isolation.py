"""The prefix cache does not leak one owner's words to another (SECURITY: prefix-cache probe).

vLLM's prefix cache is shared by every request of an engine: a prompt that starts like another
session's reuses its KV blocks, and ``cached_tokens`` (and the first token's time) told a
second session whether its guess of the first session's words was right. The pipeline salts
every request per owner (token digest; per session when authentication is off), so blocks are
shared only within one owner.

The first tests run the embedded SmolLM2 on vLLM itself (the engine starts once, ~30 s); the
last is a PROTOCOL TEST of RemoteVllm against a small local server standing in for vLLM's
OpenAI-compatible endpoint (what it checks is the request body).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from models.llm_remote import RemoteOptions, RemoteVllm
from models.llm_vllm import VllmEngine, VllmOptions
from models.prepare import prepare_llm
from models.tts import split_sentences
from server.http.auth import token_digest
from server.owner import NO_OWNER
from server.pipeline.seams import ReplyRequest, TurnTrace
from server.pipeline.voice import VoicePipeline
from server.runtime.conditions import Conditions
from server.runtime.history import CacheClass, ContextEntry, Role

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

BLOCK = VllmOptions().block_size
PERSONA = "You are a helpful assistant."
SECRET = (
    "My bank card PIN is 4821 and my online banking password is blue-harbour-17. Please keep"
    " both safe and remind me of them when I ask about my account later this week, after my"
    " trip to the mountains."
)
WRONG = SECRET.replace("4821", "7390")
CONDITIONS = Conditions(PERSONA, "joe", "default")


class _NoSpeech:
    """ASR and TTS the reply path never calls."""

    def transcribe(self, pcm: object, prefix: str = "") -> str:
        raise AssertionError("not used")

    def synthesize(self, text: str) -> Any:
        raise AssertionError("not used")


def context(*turns: tuple[Role, str]) -> tuple[ContextEntry, ...]:
    """The persona, then ``turns`` (the last one is the current user turn)."""
    entries = [ContextEntry(CacheClass.ANCHOR, Role.SYSTEM, PERSONA)]
    entries += [ContextEntry(CacheClass.RECENT, role, text) for role, text in turns]
    return tuple(entries)


def said(text: str) -> tuple[ContextEntry, ...]:
    return context((Role.USER, text))


def request(session: str, ctx: tuple[ContextEntry, ...], owner: str = NO_OWNER) -> ReplyRequest:
    """A reply request of session ``session * 32``, created by ``owner`` (NO_OWNER: no auth)."""
    plain = ReplyRequest(session * 32, 0, ctx, CONDITIONS)
    return plain if owner == NO_OWNER else replace(plain, owner=owner)


async def reply(pipeline: VoicePipeline, req: ReplyRequest) -> tuple[str, TurnTrace]:
    """The reply's text and its trace (what response.timings reports)."""
    trace = TurnTrace(endpoint_ms=0.0)
    chunks = [str(chunk) async for chunk in pipeline.reply(req, trace)]
    return " ".join(chunks), trace


def voice_pipeline(llm: Any) -> VoicePipeline:
    return VoicePipeline(
        _NoSpeech(), llm, _NoSpeech(), split_sentences, max_tokens=8, first_chunk_words=6
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def smol() -> AsyncIterator[VllmEngine]:
    folder = await asyncio.to_thread(prepare_llm)  # converts the GGUF once, then cached
    started = time.perf_counter()
    engine = await VllmEngine.start(folder)
    log.warning("SmolLM2 started in %.1f s", time.perf_counter() - started)
    yield engine
    await engine.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipeline(smol: VllmEngine) -> AsyncIterator[VoicePipeline]:
    voice = voice_pipeline(smol)
    yield voice
    await voice.asr_queue.close()  # the engine closes with the smol fixture
    await voice.tts_queue.close()


async def test_another_session_cannot_probe_a_private_prefix(pipeline: VoicePipeline) -> None:
    """Authentication off: session A types a PIN; fresh sessions guess it. Right and wrong
    guesses both read 0 cached tokens; A's own next turn still hits the cache."""
    text, first = await reply(pipeline, request("a", said(SECRET)))
    assert first.prompt_tokens > 2 * BLOCK  # whole blocks that hold the PIN, and after it
    _, right = await reply(pipeline, request("b", said(SECRET)))
    _, wrong = await reply(pipeline, request("c", said(WRONG)))
    log.warning(
        "probe: A %d/%d, right guess %d, wrong guess %d cached tokens",
        first.cached_tokens,
        first.prompt_tokens,
        right.cached_tokens,
        wrong.cached_tokens,
    )
    assert (right.cached_tokens, wrong.cached_tokens) == (0, 0)
    turn2 = context((Role.USER, SECRET), (Role.ASSISTANT, text), (Role.USER, "Why?"))
    _, again = await reply(pipeline, request("a", turn2))
    assert again.cached_tokens >= 2 * BLOCK  # the session's own blocks are still shared


async def test_sessions_of_one_owner_share_their_prefix_and_no_one_else(
    pipeline: VoicePipeline,
) -> None:
    """Authentication on: the cache scope is the token's owner, across its sessions."""
    alice, mallory = token_digest("alice-token-0123456789"), token_digest("mallory-token-987654")
    _, first = await reply(pipeline, request("d", said(SECRET), owner=alice))
    assert first.cached_tokens == 0  # nothing of hers cached yet (A's blocks are another scope)
    _, own = await reply(pipeline, request("e", said(SECRET), owner=alice))
    _, other = await reply(pipeline, request("f", said(SECRET), owner=mallory))
    assert own.cached_tokens == (own.prompt_tokens - 1) // BLOCK * BLOCK
    assert other.cached_tokens == 0


async def test_engine_salts_scope_the_cache(smol: VllmEngine) -> None:
    """VllmEngine: a salted request reuses only blocks of its own salt; unsalted ones share
    among themselves only."""
    messages = [{"role": "system", "content": PERSONA}, {"role": "user", "content": SECRET}]
    whole = (len(smol.render(messages)) - 1) // BLOCK * BLOCK

    async def cached(rid: str, salt: str | None) -> int:
        return (await smol.prefill(messages, rid, cache_salt=salt)).cached_tokens

    assert await cached("salt-1", "x" * 64) == 0
    assert await cached("salt-2", "x" * 64) == whole
    assert await cached("salt-3", "y" * 64) == 0
    assert await cached("salt-4", None) == 0
    assert await cached("salt-5", None) == whole
    assert await cached("salt-6", "y" * 64) == whole


# --------------------------------------------------------------------------- RemoteVllm
# PROTOCOL TEST of the request body RemoteVllm sends (a stand-in server, not vLLM).


@dataclass
class _FakeServer:
    """Answers every chat completion with "Hi." and records the request bodies."""

    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in (
            {"choices": [{"index": 0, "delta": {"content": "Hi."}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ):
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest_asyncio.fixture(loop_scope="module")
async def remote() -> AsyncIterator[tuple[_FakeServer, VoicePipeline]]:
    """A voice pipeline on RemoteVllm, whose server records the bodies. The operator's
    ``extra_body`` names a salt of its own: the pipeline's may not be widened by it."""
    fake = _FakeServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    options = RemoteOptions(base_url=url, model="smol", extra_body={"cache_salt": "everyone"})
    voice = voice_pipeline(RemoteVllm(options))
    yield fake, voice
    await voice.close()
    await server.close()


def salts_of(fake: _FakeServer) -> list[str]:
    """The request bodies' cache salts: each a 256-bit hex string."""
    salts = [body.get("cache_salt") for body in fake.bodies]
    log.warning("remote salts: %s", salts)
    assert all(isinstance(s, str) and re.fullmatch(r"[0-9a-f]{64}", s) for s in salts), salts
    return [str(s) for s in salts]


async def test_remote_requests_carry_a_salt_per_session(
    remote: tuple[_FakeServer, VoicePipeline],
) -> None:
    fake, voice = remote
    await voice.prefill(request("g", said(SECRET)))
    await reply(voice, request("g", said(SECRET)))
    await reply(voice, request("h", said(SECRET)))
    warm_g, reply_g, reply_h = salts_of(fake)
    assert warm_g == reply_g  # a session's warm-up fills the cache its reply reads
    assert reply_g != reply_h  # sessions without a token: one scope each
    assert not any(sid in s for sid in ("g" * 32, "h" * 32) for s in (reply_g, reply_h))


async def test_remote_requests_carry_a_salt_per_owner(
    remote: tuple[_FakeServer, VoicePipeline],
) -> None:
    fake, voice = remote
    bob, eve = token_digest("bob-token-0123456789"), token_digest("eve-token-0123456789")
    for session, owner in (("i", bob), ("j", bob), ("k", eve)):
        await reply(voice, request(session, said(SECRET), owner=owner))
    bob_i, bob_j, eve_k = salts_of(fake)
    assert bob_i == bob_j != eve_k  # one token: one scope across its sessions
    assert not any(part in bob_i for part in (bob[:16], bob[-16:]))  # the digest stays hidden
