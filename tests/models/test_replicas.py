"""Replica choice for the remote LLM: prefix affinity, load, and replicas that just failed.

The last tests run RemoteVllm against small local SSE servers that stand in for replicas (they
send one token, then hold the stream open): what is under test is the load RemoteVllm reports.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st

from models.llm import Message
from models.llm_remote import RemoteOptions, RemoteVllm
from models.replicas import AFFINITY_SLACK, ReplicaSet, common_prefix_len, prompt_key
from tests.support.server_process import free_port

PERSONA = {"role": "system", "content": "You are a helpful assistant."}
WARM = "Tell me a story about a cat who lived by the sea"


class Clock:
    """Seconds, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def urls(replicas: ReplicaSet, prompt: str, anchor: int) -> list[str]:
    return [r.url for r in replicas.order(prompt, anchor)]


def session(*turns: str) -> tuple[str, int]:
    """The prompt key of a chat: the shared persona, then ``turns`` as user/assistant turns."""
    roles = ("user", "assistant")
    return prompt_key(
        [PERSONA, *({"role": roles[i % 2], "content": t} for i, t in enumerate(turns))]
    )


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=10))
def test_common_prefix_len_matches_the_definition(a: str, b: str, shared: str) -> None:
    for x, y in ((a, b), (shared + a, shared + b)):
        pairs = enumerate(zip(x, y, strict=False))
        naive = next((i for i, (c, d) in pairs if c != d), min(len(x), len(y)))
        assert common_prefix_len(x, y) == naive


def test_prompt_key_grows_with_the_chat() -> None:
    short, anchor = session("Tell me")
    longer, anchor2 = session("Tell me a story")
    turn2, _ = session("Tell me a story", "Once upon a time", "Why?")
    assert anchor == anchor2 > 0
    assert longer.startswith(short[: common_prefix_len(short, longer)])
    assert turn2.startswith(longer)  # a later turn extends the earlier prompt
    assert common_prefix_len(short, longer) > anchor  # the growing user turn shares its start
    assert prompt_key([]) == ("", 0)


def test_without_history_the_least_loaded_goes_first_and_ties_take_turns() -> None:
    replicas = ReplicaSet(["a", "b", "c"], down_s=5)
    prompt, anchor = session("hi")
    firsts = [urls(replicas, prompt, anchor)[0] for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    a, _, c = replicas.replicas
    replicas.started(a)
    replicas.started(c)
    assert urls(replicas, prompt, anchor)[0] == "b"
    assert sorted(urls(replicas, prompt, anchor)) == ["a", "b", "c"]  # each once


def test_a_session_sticks_to_the_replica_that_holds_its_prefix() -> None:
    replicas = ReplicaSet(["a", "b"], down_s=5)
    b = replicas.replicas[1]
    warm, anchor = session(WARM)
    replicas.served(b, warm)  # a warm-up went to b
    replicas.started(b)  # and b is busier
    grown, _ = session(WARM + " and watched the boats.")
    assert urls(replicas, grown, anchor) == ["b", "a"]
    turn2, _ = session(WARM + " and watched the boats.", "Once upon a time", "Why?")
    assert urls(replicas, turn2, anchor) == ["b", "a"]
    # another session shares the persona and two words with b's prompt: it goes by load
    other, _ = session("Tell me a joke.")
    assert urls(replicas, other, anchor) == ["a", "b"]
    # a few words are not worth sticking for (the persona is cached everywhere)
    short, _ = session("Tell me a story")
    replicas.served(b, short)
    assert urls(replicas, session("Tell me a story about")[0], anchor) == ["a", "b"]


def test_affinity_holds_only_within_a_cache_salt() -> None:
    """Requests of another salt share no cached blocks: the same words are no reason to go
    to the replica that served them (nor a way to learn where they were served)."""
    replicas = ReplicaSet(["a", "b"], down_s=5)
    b = replicas.replicas[1]
    chat: list[Message] = [PERSONA, {"role": "user", "content": WARM}]
    mine, anchor = prompt_key(chat, "salt-of-alice")
    replicas.served(b, mine)
    replicas.started(b)
    assert urls(replicas, mine, anchor) == ["b", "a"]  # her own next request sticks
    theirs, anchor = prompt_key(chat, "salt-of-mallory")
    assert urls(replicas, theirs, anchor) == ["a", "b"]  # another scope goes by load
    unsalted, anchor = prompt_key(chat)
    assert urls(replicas, unsalted, anchor) == ["a", "b"]
    assert anchor < prompt_key(chat, "s")[1]  # the anchor covers the salt too


def test_affinity_yields_to_a_much_less_loaded_replica() -> None:
    replicas = ReplicaSet(["a", "b"], down_s=5)
    b = replicas.replicas[1]
    warm, anchor = session(WARM)
    replicas.served(b, warm)
    for _ in range(AFFINITY_SLACK):
        replicas.started(b)
    assert urls(replicas, warm, anchor) == ["a", "b"]
    replicas.ended(b)
    assert urls(replicas, warm, anchor) == ["b", "a"]


def test_a_failed_replica_goes_last_until_its_time_is_up() -> None:
    clock = Clock()
    replicas = ReplicaSet(["a", "b"], down_s=5, clock=clock)
    a = replicas.replicas[0]
    prompt, anchor = session("hi")
    replicas.failed(a)
    for _ in range(3):
        assert urls(replicas, prompt, anchor) == ["b", "a"]
    assert [s.down for s in replicas.status()] == [True, False]
    clock.now += 5
    assert not replicas.status()[0].down
    assert sorted(urls(replicas, prompt, anchor)) == ["a", "b"]
    replicas.failed(a)
    replicas.served(a, prompt)  # a token came after all: up again
    status = replicas.status()[0]
    assert (status.failures, status.served, status.down) == (2, 1, False)


def test_affinity_does_not_beat_a_replica_that_is_down() -> None:
    clock = Clock()
    replicas = ReplicaSet(["a", "b"], down_s=5, clock=clock)
    a = replicas.replicas[0]
    warm, anchor = session(WARM)
    replicas.served(a, warm)
    replicas.failed(a)
    assert urls(replicas, warm, anchor) == ["b", "a"]


def test_a_replica_set_needs_a_replica() -> None:
    with pytest.raises(ValueError):
        ReplicaSet([], down_s=5)


# --------------------------------------------------------------------------- RemoteVllm's load


def sse(event: dict[str, object]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


@dataclass
class HeldReplica:
    """A stand-in replica: one token at once, the rest of the reply once ``release`` is set."""

    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}))
        await self.release.wait()
        await response.write(sse({"choices": [{"index": 0, "delta": {"content": " there"}}]}))
        await response.write(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest_asyncio.fixture
async def held() -> AsyncIterator[list[tuple[HeldReplica, str]]]:
    """Two held replicas and their URLs."""
    replicas: list[tuple[HeldReplica, TestServer]] = []
    for _ in range(2):
        replica = HeldReplica()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", replica.handle)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        replicas.append((replica, server))
    yield [(r, str(s.make_url("")).rstrip("/")) for r, s in replicas]
    for replica, server in replicas:
        replica.release.set()  # no handler left waiting
        await server.close()


QUESTION: list[Message] = [{"role": "user", "content": "Hello?"}]


def in_flight(llm: RemoteVllm) -> list[int]:
    return [s.in_flight for s in llm.replica_status()]


async def test_a_reply_is_in_flight_until_its_stream_ends(
    held: list[tuple[HeldReplica, str]],
) -> None:
    (replica, url), _ = held
    refused = f"http://127.0.0.1:{free_port()}"  # tried first (ties take turns), then down
    llm = RemoteVllm(RemoteOptions(base_url=refused, model="m", more_urls=(url,)))
    try:
        stream = llm.stream(QUESTION, "whole-1", max_tokens=8)
        assert await anext(stream) == "Hi"
        assert [s.failures for s in llm.replica_status()] == [1, 0]
        assert in_flight(llm) == [0, 1]  # the failed attempt ended at once; the reply streams
        replica.release.set()
        assert [text async for text in stream] == [" there"]
        assert in_flight(llm) == [0, 0]
        replica.release.clear()
        stream = llm.stream(QUESTION, "closed-1", max_tokens=8)
        assert await anext(stream) == "Hi"
        assert in_flight(llm) == [0, 1]
        await stream.aclose()  # the consumer hangs up mid-reply
        assert in_flight(llm) == [0, 0]
    finally:
        await llm.close()


async def test_the_least_loaded_choice_sees_replies_still_streaming(
    held: list[tuple[HeldReplica, str]],
) -> None:
    (_, url_a), (b, url_b) = held
    b.release.set()  # b answers in full, a holds its reply open
    llm = RemoteVllm(RemoteOptions(base_url=url_a, model="m", more_urls=(url_b,)))
    try:
        streaming = llm.stream(QUESTION, "long-1", max_tokens=8)
        assert await anext(streaming) == "Hi"  # ties take turns: a first
        for n in range(2):  # the second one's turn is a's, but a is still busy
            deltas = [text async for text in llm.stream(QUESTION, f"short-{n}", max_tokens=8)]
            assert deltas == ["Hi", " there"]
        assert [s.served for s in llm.replica_status()] == [1, 2]
        assert in_flight(llm) == [1, 0]
        await streaming.aclose()
    finally:
        await llm.close()
