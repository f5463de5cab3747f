"""LLM backends: the in-process vLLM engine on real models, and the remote adapter's protocol.

The VllmEngine tests run vLLM itself (no mocks): a tiny random-weight Llama for the mechanics
(streaming, abort, prefix cache, prefill) and the prepared SmolLM2-135M for one real answer.
Each engine starts once per module (~20-40 s). The RemoteVllm tests are PROTOCOL TESTS of the
adapter only: they talk to a small local aiohttp server that fakes vLLM's OpenAI-compatible SSE
stream, not to vLLM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from models.llm import LlmEngine, LlmError, Message
from models.llm_remote import RemoteOptions, RemoteVllm
from models.llm_vllm import VllmEngine, VllmOptions
from models.prepare import prepare_llm
from tests.support.llm_helpers import chat, collect, stats_of
from tests.support.tiny_llama import TEXT, build_tiny_llama

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

BLOCK = VllmOptions().block_size


def _engines(local: VllmEngine, remote: RemoteVllm) -> list[LlmEngine]:
    """Both backends satisfy the LlmEngine Protocol (checked by mypy)."""
    return [local, remote]


# --------------------------------------------------------------------------- tiny model


_started: list[VllmEngine] = []  # engines of this module; a new one closes the older ones


async def start_engine(folder: Path) -> VllmEngine:
    """Start an engine on ``folder`` after closing the others (one at a time on small machines)."""
    while _started:
        await _started.pop().close()
    started = time.perf_counter()
    engine = await VllmEngine.start(folder)
    log.warning("engine on %s started in %.1f s", folder.name, time.perf_counter() - started)
    _started.append(engine)
    return engine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tiny(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[VllmEngine]:
    engine = await start_engine(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
    yield engine
    await engine.close()


async def test_stream_yields_several_deltas(tiny: VllmEngine) -> None:
    deltas = await collect(tiny.stream(chat("stream"), "stream-1", max_tokens=16))
    assert len(deltas) > 1
    assert all(deltas)
    stats = stats_of(tiny, "stream-1")
    assert stats.prompt_tokens == len(tiny.render(chat("stream")))
    assert stats.output_tokens == 16  # the tiny model never emits its end token
    assert stats.finish_reason == "length"
    assert stats.ttft_ms is not None and stats.ttft_ms > 0
    log.warning("tiny stream: %d deltas, %s", len(deltas), stats)


async def test_greedy_is_deterministic(tiny: VllmEngine) -> None:
    first = await collect(tiny.stream(chat("greedy"), "greedy-1", max_tokens=12))
    second = await collect(tiny.stream(chat("greedy"), "greedy-2", max_tokens=12))
    assert "".join(first) == "".join(second)


async def test_abort_ends_running_stream(tiny: VllmEngine) -> None:
    stream = tiny.stream(chat("abort"), "abort-1", max_tokens=1500)
    assert await anext(stream)
    started = time.perf_counter()
    await tiny.abort("abort-1")
    rest = await collect(stream)
    latency_ms = (time.perf_counter() - started) * 1000
    stats = stats_of(tiny, "abort-1")
    assert stats.finish_reason == "abort"
    assert stats.output_tokens < 1500
    assert latency_ms < 500
    assert tiny.running() == 0
    log.warning("abort: stream ended %.1f ms after abort(), %d late deltas", latency_ms, len(rest))


async def test_closing_the_stream_aborts_the_request(tiny: VllmEngine) -> None:
    stream = tiny.stream(chat("close"), "close-1", max_tokens=1500)
    assert await anext(stream)
    await stream.aclose()
    assert tiny.running() == 0
    stats = stats_of(tiny, "close-1")
    assert stats.finish_reason == "abort"
    assert stats.output_tokens < 1500


async def test_cancelling_the_consumer_aborts_the_request(tiny: VllmEngine) -> None:
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in tiny.stream(chat("cancel"), "cancel-1", max_tokens=1500):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tiny.running() == 0
    assert stats_of(tiny, "cancel-1").finish_reason == "abort"


async def test_second_turn_hits_the_prefix_cache(tiny: VllmEngine) -> None:
    turn1 = chat("turns")
    assert len(tiny.render(turn1)) > 3 * BLOCK
    reply = "".join(await collect(tiny.stream(turn1, "turn-1", max_tokens=8)))
    first = stats_of(tiny, "turn-1")
    assert first.cached_tokens == 0
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
    await collect(tiny.stream(turn2, "turn-2", max_tokens=8))
    second = stats_of(tiny, "turn-2")
    assert second.cached_tokens >= 2 * BLOCK
    assert second.cached_tokens % BLOCK == 0
    # the blocks of turn 1's reply count too, where turn 2 renders it to the same tokens
    assert second.cached_tokens <= first.prompt_tokens + first.output_tokens
    log.warning("prefix cache: turn 1 %s, turn 2 %s", first, second)


async def test_prefill_warms_the_cache_for_stream(tiny: VllmEngine) -> None:
    messages = chat("prefill")
    warm = await tiny.prefill(messages, "prefill-1")
    assert warm.output_tokens == 1
    assert warm.cached_tokens == 0
    assert warm.prompt_tokens == len(tiny.render(messages))
    await collect(tiny.stream(messages, "prefill-2", max_tokens=4))
    hit = stats_of(tiny, "prefill-2")
    # every whole block but the one holding the last prompt token (vLLM recomputes that token)
    assert hit.cached_tokens == (warm.prompt_tokens - 1) // BLOCK * BLOCK
    log.warning("prefill %s then stream %s", warm, hit)


async def test_concurrent_streams(tiny: VllmEngine) -> None:
    a, b = await asyncio.gather(
        collect(tiny.stream(chat("concurrent a"), "conc-a", max_tokens=10)),
        collect(tiny.stream(chat("concurrent b"), "conc-b", max_tokens=10)),
    )
    assert a and b
    assert stats_of(tiny, "conc-a").output_tokens == stats_of(tiny, "conc-b").output_tokens == 10


async def test_prompt_too_long_is_an_llm_error(tiny: VllmEngine) -> None:
    messages = [{"role": "user", "content": TEXT * 40}]
    with pytest.raises(LlmError, match="no room"):
        await collect(tiny.stream(messages, "long-1", max_tokens=8))
    assert tiny.running() == 0


async def test_unknown_model_folder_is_an_llm_error(tmp_path: Path) -> None:
    with pytest.raises(LlmError, match="no model"):
        await VllmEngine.start(tmp_path)


# --------------------------------------------------------------------------- SmolLM2 (real)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def smol() -> AsyncIterator[VllmEngine]:
    started = time.perf_counter()
    folder = await asyncio.to_thread(prepare_llm)  # converts the GGUF once (~20 s), then cached
    log.warning("SmolLM2 prepared in %.1f s", time.perf_counter() - started)
    engine = await start_engine(folder)
    yield engine
    await engine.close()


async def test_smollm2_answers_a_question(smol: VllmEngine) -> None:
    messages: list[Message] = [{"role": "user", "content": "What is the capital of France?"}]
    started = time.perf_counter()
    text = "".join(await collect(smol.stream(messages, "smol-1", max_tokens=60)))
    elapsed = time.perf_counter() - started
    stats = stats_of(smol, "smol-1")
    log.warning("SmolLM2 in %.2f s: %r %s", elapsed, text, stats)
    assert text.strip()
    assert "paris" in text.lower()  # greedy: "The capital of France is Paris."
    assert stats.finish_reason in ("stop", "length")
    assert stats.ttft_ms is not None


# --------------------------------------------------------------------------- RemoteVllm protocol
# PROTOCOL TESTS of the RemoteVllm adapter against a fake SSE server, not against vLLM.


@dataclass
class FakeVllm:
    """A local stand-in for vLLM's /v1/chat/completions streaming endpoint."""

    mode: str = "ok"  # ok | endless | http_error | stall | error_event | truncated
    bodies: list[dict[str, Any]] = field(default_factory=list)
    request_ids: list[str | None] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        self.request_ids.append(request.headers.get("X-Request-Id"))
        if self.mode == "http_error":
            return web.json_response({"error": {"message": "model not found"}}, status=404)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        send = self._sender(response)
        try:
            await send({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            if self.mode == "endless":
                while True:
                    await send({"choices": [{"index": 0, "delta": {"content": "la "}}]})
                    await asyncio.sleep(0.01)
            if self.mode == "stall":
                await asyncio.sleep(5)
            if self.mode == "error_event":
                await send({"error": {"message": "engine died", "code": 500}})
                return response
            for word in ("Paris", " is", " the capital."):
                await send({"choices": [{"index": 0, "delta": {"content": word}}]})
            await send({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            if self.mode == "truncated":
                return response
            usage = {
                "prompt_tokens": 40,
                "completion_tokens": 3,
                "total_tokens": 43,
                "prompt_tokens_details": {"cached_tokens": 32},
            }
            await send({"choices": [], "usage": usage})
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnected.set()
            raise
        return response

    @staticmethod
    def _sender(response: web.StreamResponse) -> Callable[[dict[str, Any]], Awaitable[None]]:
        async def send(event: dict[str, Any]) -> None:
            await response.write(f"data: {json.dumps(event)}\n\n".encode())

        return send


@pytest_asyncio.fixture(loop_scope="module")
async def fake() -> AsyncIterator[tuple[FakeVllm, str]]:
    state = FakeVllm()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", state.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield state, str(server.make_url("")).rstrip("/")
    await server.close()


QUESTION: list[Message] = [{"role": "user", "content": "What is the capital of France?"}]


async def test_remote_streams_deltas_and_usage(fake: tuple[FakeVllm, str]) -> None:
    state, url = fake
    llm = RemoteVllm(RemoteOptions(base_url=url, model="smol"))
    try:
        deltas = await collect(llm.stream(QUESTION, "r-1", max_tokens=60))
    finally:
        await llm.close()
    assert deltas == ["Paris", " is", " the capital."]
    stats = stats_of(llm, "r-1")
    assert (stats.prompt_tokens, stats.cached_tokens, stats.output_tokens) == (40, 32, 3)
    assert stats.finish_reason == "stop"
    assert stats.ttft_ms is not None
    body = state.bodies[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 60 and body["model"] == "smol"
    assert body["messages"] == QUESTION
    assert state.request_ids == ["r-1"]


async def test_remote_sends_the_cache_salt(fake: tuple[FakeVllm, str]) -> None:
    """The salt goes in the body (vLLM's ``cache_salt``), over one in ``extra_body``; without
    one, the body is the operator's."""
    state, url = fake
    llm = RemoteVllm(RemoteOptions(base_url=url, model="smol", extra_body={"cache_salt": "all"}))
    try:
        await collect(llm.stream(QUESTION, "r-salt-1", max_tokens=4, cache_salt="s" * 64))
        await llm.prefill(QUESTION, "r-salt-2", cache_salt="t" * 64)
        await collect(llm.stream(QUESTION, "r-salt-3", max_tokens=4))
    finally:
        await llm.close()
    assert [b["cache_salt"] for b in state.bodies] == ["s" * 64, "t" * 64, "all"]


@pytest.mark.parametrize("salt", ["", "x" * 129, "a/b", "a@b", "a\\b", "a\x00b"])
async def test_a_salt_vllm_refuses_is_an_llm_error(fake: tuple[FakeVllm, str], salt: str) -> None:
    state, url = fake
    llm = RemoteVllm(RemoteOptions(base_url=url, model="smol"))
    try:
        with pytest.raises(LlmError, match="cache_salt"):
            await collect(llm.stream(QUESTION, "r-bad-salt", max_tokens=4, cache_salt=salt))
    finally:
        await llm.close()
    assert state.bodies == []  # refused before anything was sent


async def test_remote_prefill_asks_for_one_token(fake: tuple[FakeVllm, str]) -> None:
    state, url = fake
    llm = RemoteVllm(RemoteOptions(base_url=url, model="smol"))
    try:
        stats = await llm.prefill(QUESTION, "r-prefill")
    finally:
        await llm.close()
    assert state.bodies[0]["max_tokens"] == 1
    assert stats.cached_tokens == 32


async def test_remote_abort_closes_the_stream(fake: tuple[FakeVllm, str]) -> None:
    state, url = fake
    state.mode = "endless"
    llm = RemoteVllm(RemoteOptions(base_url=url, model="smol"))
    try:
        stream = llm.stream(QUESTION, "r-abort", max_tokens=10_000)
        assert await anext(stream)
        started = time.perf_counter()
        await llm.abort("r-abort")
        await asyncio.wait_for(collect(stream), 2)
        latency_ms = (time.perf_counter() - started) * 1000
        await asyncio.wait_for(state.disconnected.wait(), 2)  # the server saw the client leave
    finally:
        await llm.close()
    assert stats_of(llm, "r-abort").finish_reason == "abort"
    assert latency_ms < 500


async def test_remote_closing_the_stream_disconnects(fake: tuple[FakeVllm, str]) -> None:
    state, url = fake
    state.mode = "endless"
    llm = RemoteVllm(RemoteOptions(base_url=url, model="smol"))
    try:
        stream = llm.stream(QUESTION, "r-close", max_tokens=10_000)
        assert await anext(stream)
        await stream.aclose()
        await asyncio.wait_for(state.disconnected.wait(), 2)
    finally:
        await llm.close()
    assert stats_of(llm, "r-close").finish_reason == "abort"


@pytest.mark.parametrize(
    ("mode", "match"),
    [
        ("http_error", "answered 404"),
        ("stall", "failed"),
        ("error_event", "engine died"),
        ("truncated", "before \\[DONE\\]"),
    ],
)
async def test_remote_failures_are_llm_errors(
    fake: tuple[FakeVllm, str], mode: str, match: str
) -> None:
    state, url = fake
    state.mode = mode
    llm = RemoteVllm(RemoteOptions(base_url=url, model="smol", read_timeout_s=0.3))
    try:
        with pytest.raises(LlmError, match=match):
            await collect(llm.stream(QUESTION, f"r-{mode}", max_tokens=10))
    finally:
        await llm.close()


async def test_remote_unreachable_server_is_an_llm_error() -> None:
    llm = RemoteVllm(RemoteOptions(base_url="http://127.0.0.1:9", model="smol"))
    try:
        with pytest.raises(LlmError):
            await collect(llm.stream(QUESTION, "r-down", max_tokens=10))
    finally:
        await llm.close()
