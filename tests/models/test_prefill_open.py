"""Incremental prefill on the embedded SmolLM2: the warm-up's prompt, sent while the user is
still speaking, is a token prefix of the reply's, and the reply reuses its whole KV blocks.

The prompt tests use the model's own tokenizer and chat template (no engine). The cache test
runs vLLM itself (the engine starts once, ~30 s): a conversation of a few turns, then warm-ups
with the growing words of the next question, as the partial loop sends them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from models.llm import ChatPrompts, LlmError, Message, settled_words
from models.llm_vllm import VllmEngine, VllmOptions
from models.prepare import prepare_llm
from tests.support.llm_helpers import collect, stats_of

log = logging.getLogger(__name__)

BLOCK = VllmOptions().block_size
PERSONA = "You are a helpful assistant."
HISTORY: list[Message] = [
    {"role": "system", "content": PERSONA},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
]
QUESTION = (
    "Tell me about the history of the city, how it grew from a small settlement on an island"
    " in the river into a large capital, and which old buildings I should visit first."
)


def said(words: str, history: list[Message] = HISTORY) -> list[Message]:
    return [*history, {"role": "user", "content": words}]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return prepare_llm()  # converts the GGUF once (~20 s), then cached


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> ChatPrompts:
    from transformers import AutoTokenizer

    return ChatPrompts(AutoTokenizer.from_pretrained(str(model_dir)))


@pytest.mark.parametrize(
    ("partial", "final"),
    [
        ("Tell me about the", "Tell me about the weather."),
        ("Tell me about the park", "Tell me about the parking near the station."),  # word grows
        ("Hello.", "Hello. How are you?"),
        ("I have 12", "I have 123 apples."),  # a number grows
        ("It's", "It's fine, isn't it?"),
        ("Take me to the café", "Take me to the café near the river, please."),
        ("one two three", "one two three, four"),
        ("What", "What?"),
        (QUESTION[:60].rsplit(" ", 1)[0], QUESTION),
    ],
)
def test_the_open_prompt_is_a_token_prefix_of_the_reply_prompt(
    prompts: ChatPrompts, partial: str, final: str
) -> None:
    for history in (HISTORY[:1], HISTORY):
        warm = prompts.render_open(said(partial, history))
        reply = prompts.render(said(final, history))
        assert reply[: len(warm)] == warm
        assert len(warm) < len(reply)
        # it holds everything before the user's words, and the words it keeps
        before = prompts.render_open(said("", history))
        kept = prompts.render_open(said(settled_words(partial) + " x", history))
        assert len(before) <= len(warm) <= len(kept)


def test_settled_words_leave_out_the_last_word() -> None:
    assert settled_words("Tell me about the park") == "Tell me about the"
    assert settled_words("Hello.") == ""
    assert settled_words("two  words ") == "two"
    assert settled_words("") == ""


# --------------------------------------------------------------------------- the engine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def smol(model_dir: Path) -> AsyncIterator[VllmEngine]:
    started = time.perf_counter()
    engine = await VllmEngine.start(model_dir)
    log.warning("SmolLM2 started in %.1f s", time.perf_counter() - started)
    yield engine
    await engine.close()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.timeout(300)
async def test_the_reply_reuses_the_blocks_the_warm_ups_filled(smol: VllmEngine) -> None:
    """Turn 1 is cached by its reply; while the user says question 2, warm-ups with its
    words so far. The reply reuses every whole block of the last warm-up's prompt: more than
    the same reply without warm-ups (another cache scope), which reuses only turn 1's."""
    words = QUESTION.split()
    reply_ids = smol.render(said(QUESTION))
    assert len(reply_ids) > 2 * BLOCK
    stats = {}
    for scope in ("warmed", "cold"):
        await collect(smol.stream(HISTORY[:2], f"{scope}-turn-1", 8, cache_salt=scope))
        if scope == "warmed":
            for n in range(6, len(words) - 2, 6):  # the partial loop's growing words
                partial = said(" ".join(words[:n]))
                warm = await smol.prefill_open(partial, f"warm-{n}", cache_salt=scope)
                assert warm.prompt_tokens == len(smol.prompts.render_open(partial))
                assert warm.output_tokens == 1
        await collect(smol.stream(said(QUESTION), f"{scope}-turn-2", 4, cache_salt=scope))
        stats[scope] = stats_of(smol, f"{scope}-turn-2")
    warmed, cold = stats["warmed"], stats["cold"]
    log.warning("reply after warm-ups %s; without %s; last warm-up %s", warmed, cold, warm)
    assert warmed.prompt_tokens == cold.prompt_tokens == len(reply_ids)
    assert warmed.cached_tokens == warm.prompt_tokens // BLOCK * BLOCK
    assert warmed.cached_tokens >= cold.cached_tokens + BLOCK


@pytest.mark.asyncio(loop_scope="module")
async def test_a_warm_up_of_a_single_word_warms_the_turns_before_it(smol: VllmEngine) -> None:
    ids = smol.prompts.render_open(said("Tell"))
    assert ids == smol.prompts.render_open(said(""))  # the word may grow: not sent
    warm = await smol.prefill_open(said("Tell"), "one-word", cache_salt="one-word")
    assert warm.prompt_tokens == len(ids)


def test_no_messages_is_an_llm_error(prompts: ChatPrompts) -> None:
    with pytest.raises(LlmError):
        prompts.render_open([])
