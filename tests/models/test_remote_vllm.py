"""RemoteVllm against a real vLLM OpenAI-compatible server (``vllm serve``) on loopback.

The server runs the tiny random-weight Llama on CPU, started once for the module (~25 s alone,
longer on a busy machine) and killed by PID at the end. Faulty replicas are real faults, not
fakes of vLLM: a closed port (connection refused) and a socket that accepts connections but
never answers (a hung server). Figures (startup, TTFT, abort, failover) are logged as warnings.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from transformers import AutoTokenizer

from models.llm import LlmError, Message
from models.llm_remote import LlmUnavailable, RemoteOptions, RemoteVllm
from tests.support.llm_helpers import chat, collect, stats_of
from tests.support.peers import Peer
from tests.support.server_process import ServerProcess, free_port
from tests.support.tiny_llama import TEXT, build_tiny_llama
from tests.support.vllm_server import VllmServer

log = logging.getLogger(__name__)

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(420),
    pytest.mark.usefixtures("client_ice"),  # tests/conftest.py
]

BLOCK = 32  # --block-size of the server
LONG = 12_000  # tokens: a reply that takes the tiny model >10 s, unless it is aborted


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def vllm(model_dir: Path) -> Iterator[VllmServer]:
    server = VllmServer(model_dir).start()
    log.warning("vllm serve healthy after %.1f s", server.startup_s)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hung_url() -> Iterator[str]:
    """A replica that accepts TCP connections (the kernel does) but never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def refused_url() -> str:
    """A replica that is down: nothing listens on its port."""
    return f"http://127.0.0.1:{free_port()}"


@pytest_asyncio.fixture(loop_scope="module")
async def remote(vllm: VllmServer) -> AsyncIterator[RemoteVllm]:
    # a busy machine may keep the CPU server from its first token for longer than the 10 s a
    # production replica gets before failover; the failover tests set their own short bound
    llm = RemoteVllm(
        RemoteOptions(base_url=vllm.url, model=vllm.served_name, first_token_timeout_s=60.0)
    )
    yield llm
    await llm.close()


def prompt_tokens(model_dir: Path, messages: list[Message]) -> int:
    """Tokens of the prompt the server renders (chat template, assistant turn opened)."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


async def running(vllm: VllmServer) -> float:
    return await asyncio.to_thread(vllm.metric, "vllm:num_requests_running")


async def generated(vllm: VllmServer) -> float:
    """Tokens the server has generated so far (all requests)."""
    return await asyncio.to_thread(vllm.metric, "vllm:generation_tokens_total")


async def wait_running(vllm: VllmServer, want: float, timeout: float = 15.0) -> float:
    """Seconds until the server reports ``want`` requests running (polled every 50 ms)."""
    started = time.monotonic()
    while (now := await running(vllm)) != want:
        if time.monotonic() - started > timeout:
            raise AssertionError(f"vllm:num_requests_running stayed {now}, wanted {want}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


# --------------------------------------------------------------------------- the happy path


async def test_stream_yields_deltas_and_usage(
    remote: RemoteVllm, vllm: VllmServer, model_dir: Path
) -> None:
    messages = chat("stream")
    before = await generated(vllm)
    deltas = await collect(remote.stream(messages, "stream-1", max_tokens=16))
    assert len(deltas) > 1 and all(deltas)
    stats = stats_of(remote, "stream-1")
    assert stats.prompt_tokens == prompt_tokens(model_dir, messages)
    assert stats.output_tokens == 16  # the tiny model never emits its end token
    assert stats.finish_reason == "length"
    assert stats.ttft_ms is not None and stats.ttft_ms > 0
    await wait_running(vllm, 0)  # the gauge follows the engine's steps
    assert await generated(vllm) - before == 16  # the counter the abort tests read
    log.warning("remote stream: %d deltas, %s", len(deltas), stats)


async def test_greedy_replies_are_the_same(remote: RemoteVllm) -> None:
    first = await collect(remote.stream(chat("greedy"), "greedy-1", max_tokens=12))
    second = await collect(remote.stream(chat("greedy"), "greedy-2", max_tokens=12))
    assert "".join(first) == "".join(second)


async def test_prefix_warm_ups_make_the_reply_hit_the_cache(
    remote: RemoteVllm, vllm: VllmServer
) -> None:
    """Incremental prefill as the voice pipeline does it: warm-ups with the growing user turn
    while the user speaks, then the reply, which computes only the tail."""
    hits_before = await asyncio.to_thread(vllm.metric, "vllm:prefix_cache_hits_total")
    first = await remote.prefill(chat("warm", "Tell me"), "warm-1")
    assert first.output_tokens == 1 and first.cached_tokens == 0
    second = await remote.prefill(chat("warm", "Tell me a story"), "warm-2")
    assert second.cached_tokens >= 3 * BLOCK  # the system prompt's blocks, computed once
    assert second.cached_tokens % BLOCK == 0
    messages = chat("warm", "Tell me a story about a cat.")
    started = time.perf_counter()
    await collect(remote.stream(messages, "warm-reply", max_tokens=4))
    elapsed_ms = (time.perf_counter() - started) * 1000
    reply = stats_of(remote, "warm-reply")
    warm = await remote.prefill(messages, "warm-3")  # the reply's own prompt, now cached
    # every whole block but the one holding the last prompt token (vLLM recomputes that token)
    assert warm.cached_tokens == (warm.prompt_tokens - 1) // BLOCK * BLOCK
    assert reply.cached_tokens >= second.cached_tokens
    hits_after = await asyncio.to_thread(vllm.metric, "vllm:prefix_cache_hits_total")
    assert hits_after - hits_before >= second.cached_tokens + reply.cached_tokens
    log.warning(
        "warm-ups %s / %s; reply %s in %.0f ms; re-warm %s", first, second, reply, elapsed_ms, warm
    )


async def test_the_cache_salt_scopes_the_servers_prefix_cache(remote: RemoteVllm) -> None:
    """``cache_salt`` in the request body: vLLM's server takes it, and a prompt reuses the
    cached blocks of its own salt only (another salt, or none, computes them again)."""
    messages = chat("salted")

    async def cached(request_id: str, salt: str | None) -> tuple[int, int]:
        stats = await remote.prefill(messages, request_id, cache_salt=salt)
        return stats.cached_tokens, stats.prompt_tokens

    assert (await cached("salt-1", "a" * 64))[0] == 0
    hit, prompt = await cached("salt-2", "a" * 64)
    assert hit == (prompt - 1) // BLOCK * BLOCK > 0
    assert (await cached("salt-3", "b" * 64))[0] == 0
    assert (await cached("salt-4", None))[0] == 0


async def test_cold_and_warm_ttft(remote: RemoteVllm) -> None:
    """TTFT through HTTP for a prompt the server has not seen, then for the same one warmed."""
    cold_id, warm_id = "ttft-cold", "ttft-warm"
    await collect(remote.stream(chat("ttft"), cold_id, max_tokens=2))
    await remote.prefill(chat("ttft", "Why?"), "ttft-prefill")
    await collect(remote.stream(chat("ttft", "Why?"), warm_id, max_tokens=2))
    cold, warm = stats_of(remote, cold_id), stats_of(remote, warm_id)
    assert cold.ttft_ms is not None and warm.ttft_ms is not None
    assert warm.cached_tokens > cold.cached_tokens
    log.warning("remote TTFT: cold %.1f ms, warmed %.1f ms", cold.ttft_ms, warm.ttft_ms)


# --------------------------------------------------------------------------- abort


async def test_closing_the_stream_aborts_the_request_on_the_server(
    remote: RemoteVllm, vllm: VllmServer
) -> None:
    before = await generated(vllm)
    stream = remote.stream(chat("close"), "close-1", max_tokens=LONG)
    assert await anext(stream)
    await wait_running(vllm, 1)  # the gauge follows the engine's steps
    started = time.monotonic()
    await stream.aclose()  # what the voice pipeline does on barge-in
    freed_s = await wait_running(vllm, 0)
    spent = await generated(vllm) - before
    assert spent < LONG  # the server stopped generating it
    stats = stats_of(remote, "close-1")
    assert stats.finish_reason == "abort"
    assert stats.output_tokens < LONG
    log.warning(
        "abort by closing: server freed the request %.0f ms after aclose() (%.0f ms polling); "
        "it generated %d of %d tokens",
        (time.monotonic() - started) * 1000,
        freed_s * 1000,
        spent,
        LONG,
    )


async def test_abort_by_request_id_ends_the_stream(remote: RemoteVllm, vllm: VllmServer) -> None:
    before = await generated(vllm)
    stream = remote.stream(chat("abort"), "abort-1", max_tokens=LONG)
    assert await anext(stream)
    started = time.perf_counter()
    await remote.abort("abort-1")
    late = await asyncio.wait_for(collect(stream), 5)
    ended_ms = (time.perf_counter() - started) * 1000
    await wait_running(vllm, 0)
    assert await generated(vllm) - before < LONG
    assert stats_of(remote, "abort-1").finish_reason == "abort"
    log.warning("abort(): stream ended %.1f ms later, %d late deltas", ended_ms, len(late))


async def test_cancelling_the_consumer_aborts_the_request(
    remote: RemoteVllm, vllm: VllmServer
) -> None:
    before = await generated(vllm)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in remote.stream(chat("cancel"), "cancel-1", max_tokens=LONG):
            first.set()
            await asyncio.sleep(0)  # a consumer that does something with each delta

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_running(vllm, 0)
    assert await generated(vllm) - before < LONG
    assert stats_of(remote, "cancel-1").finish_reason == "abort"


async def test_abort_while_waiting_for_a_hung_replica(hung_url: str, vllm: VllmServer) -> None:
    """Barge-in before the first token: abort() stops the attempt, no other replica is tried."""
    llm = RemoteVllm(RemoteOptions(base_url=hung_url, model="tiny", more_urls=(vllm.url,)))
    try:
        stream = llm.stream(chat("hung-abort"), "hung-abort-1", max_tokens=8)
        pending = asyncio.ensure_future(collect(stream))
        await asyncio.sleep(0.3)
        started = time.perf_counter()
        await llm.abort("hung-abort-1")
        assert await asyncio.wait_for(pending, 5) == []
        ended_ms = (time.perf_counter() - started) * 1000
    finally:
        await llm.close()
    assert stats_of(llm, "hung-abort-1").finish_reason == "abort"
    hung, real = llm.replica_status()
    assert hung.failures == 0 and real.served == 0  # an abort is not a failure; no retry
    log.warning("abort() before the first token: stream ended %.1f ms later", ended_ms)


# --------------------------------------------------------------------------- replicas and faults


async def test_hung_replica_times_out_and_the_next_one_answers(
    hung_url: str, vllm: VllmServer
) -> None:
    llm = RemoteVllm(
        RemoteOptions(
            base_url=hung_url, model="tiny", more_urls=(vllm.url,), first_token_timeout_s=1.0
        )
    )
    try:
        started = time.perf_counter()
        deltas = await collect(llm.stream(chat("failover"), "failover-1", max_tokens=8))
        elapsed_ms = (time.perf_counter() - started) * 1000
        hung, real = llm.replica_status()
        assert deltas
        assert (hung.failures, hung.served, hung.down) == (1, 0, True)
        assert (real.failures, real.served) == (0, 1)
        # while it is marked down the hung replica is tried last: no second timeout
        started = time.perf_counter()
        await collect(llm.stream(chat("failover"), "failover-2", max_tokens=8))
        second_ms = (time.perf_counter() - started) * 1000
        assert llm.replica_status()[0].failures == 1
    finally:
        await llm.close()
    stats = stats_of(llm, "failover-1")
    assert stats.ttft_ms is not None and stats.ttft_ms >= 1000  # the timeout counts in TTFT
    assert stats.finish_reason == "length"
    log.warning(
        "failover from a hung replica: reply done in %.0f ms (TTFT %.0f ms, timeout 1 s); "
        "next request %.0f ms",
        elapsed_ms,
        stats.ttft_ms,
        second_ms,
    )


async def test_refused_replica_is_skipped_at_once(refused_url: str, vllm: VllmServer) -> None:
    llm = RemoteVllm(RemoteOptions(base_url=refused_url, model="tiny", more_urls=(vllm.url,)))
    try:
        started = time.perf_counter()
        deltas = await collect(llm.stream(chat("refused"), "refused-1", max_tokens=8))
        elapsed_ms = (time.perf_counter() - started) * 1000
    finally:
        await llm.close()
    down, real = llm.replica_status()
    assert deltas
    assert down.failures == 1 and real.served == 1
    log.warning("failover from a refused replica: reply done in %.0f ms", elapsed_ms)


async def test_no_replica_left_is_llm_unavailable(refused_url: str, hung_url: str) -> None:
    llm = RemoteVllm(
        RemoteOptions(
            base_url=refused_url, model="tiny", more_urls=(hung_url,), first_token_timeout_s=0.5
        )
    )
    try:
        with pytest.raises(LlmUnavailable) as caught:
            await collect(llm.stream(chat("none"), "none-1", max_tokens=8))
        with pytest.raises(LlmUnavailable):  # a warm-up fails the same way
            await llm.prefill(chat("none"), "none-2")
    finally:
        await llm.close()
    message = str(caught.value)
    assert refused_url in message and hung_url in message
    assert "no token within 0.5 s" in message


async def test_server_errors_are_llm_errors_and_not_retried(
    vllm: VllmServer, refused_url: str
) -> None:
    """A request the server rejects (4xx) fails the same on every replica: no retry."""
    llm = RemoteVllm(RemoteOptions(base_url=vllm.url, model="no-such-model"))
    try:
        with pytest.raises(LlmError, match="answered 404"):
            await collect(llm.stream(chat("404"), "404-1", max_tokens=8))
    finally:
        await llm.close()
    assert llm.replica_status()[0].failures == 0
    llm = RemoteVllm(RemoteOptions(base_url=vllm.url, model="tiny", more_urls=(refused_url,)))
    too_long: list[Message] = [{"role": "user", "content": TEXT * 400}]  # > 16,384 tokens
    try:
        with pytest.raises(LlmError, match="answered 400") as caught:
            await collect(llm.stream(too_long, "long-1", max_tokens=8))
    finally:
        await llm.close()
    assert not isinstance(caught.value, LlmUnavailable)
    assert [r.failures for r in llm.replica_status()] == [0, 0]
    await wait_running(vllm, 0)  # the gauge follows the engine's steps


# --------------------------------------------------------------------------- the server, end to end


def voice_server(llm_urls: list[str], model: str) -> ServerProcess:
    """The server with the voice pipeline (Whisper, Piper) on a remote LLM; audio only."""
    return ServerProcess(
        {
            "pipeline.llm_remote_urls": ",".join(llm_urls),
            "pipeline.llm_remote_model": model,
            "pipeline.llm_max_tokens": "24",
            "transport.video": "false",
        }
    ).start(timeout=120)


async def test_server_answers_through_remote_vllm_with_failover(
    vllm: VllmServer, refused_url: str
) -> None:
    """A typed message to the real server: its reply comes from vLLM, past a replica that is
    down, and is spoken (Piper) to an aiortc peer."""
    before = await asyncio.to_thread(vllm.metric, "vllm:request_success_total")
    server = await asyncio.to_thread(voice_server, [refused_url, vllm.url], vllm.served_name)
    peer = Peer(server.url, video=False)
    try:
        await peer.connect()
        await peer.wait_event("session.created")
        started = time.monotonic()
        peer.send({"type": "conversation.item.create", "text": "Tell me a story about a cat."})
        created = await peer.wait_event("response.created", timeout=30)
        delta = await peer.wait_event("response.audio_transcript.delta", timeout=30)
        first_text_ms = (time.monotonic() - started) * 1000
        done = await peer.wait_event("response.done", timeout=60)
        await asyncio.sleep(0.3)
        loud_s = sum(float(np.abs(pcm).max()) > 1000 for _, pcm in peer.audio) * 0.02
    finally:
        await peer.close()
        assert server.stop() == 0, server.log()
    assert created["epoch"] == delta["epoch"] == done["epoch"] == 0
    assert delta["delta"].strip()
    assert done["status"] == "completed", done
    assert loud_s > 0.5  # the reply was spoken
    assert not [e for _, e in peer.events if e.get("type") == "error"]
    after = await asyncio.to_thread(vllm.metric, "vllm:request_success_total")
    assert after > before  # vLLM served it
    assert "trying the next replica" in server.log()
    log.warning(
        "server via remote vLLM: first text %.0f ms after the typed message, %.1f s spoken",
        first_text_ms,
        loud_s,
    )


async def test_server_reports_an_unreachable_llm_as_an_error_event(refused_url: str) -> None:
    server = await asyncio.to_thread(voice_server, [refused_url], "tiny")
    peer = Peer(server.url, video=False)
    try:
        await peer.connect()
        await peer.wait_event("session.created")
        for attempt in range(2):  # the session survives the failure and can try again
            n = len(peer.events)
            peer.send({"type": "conversation.item.create", "text": "Hello?"})
            error = await peer.wait_event("error", timeout=30, after=n)
            done = await peer.wait_event("response.done", timeout=30, after=n)
            assert error["error"]["code"] == "engine_error", error
            assert "LlmUnavailable" in error["error"]["message"]
            assert refused_url not in error["error"]["message"]  # internal: only in the log
            assert done["status"] == "failed" and done["epoch"] == 0, (attempt, done)
    finally:
        await peer.close()
        assert server.stop() == 0, server.log()
