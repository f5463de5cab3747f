"""The safety note: a turn that names a hazard gets a system message after it in the reply's
prompt, and only the reply's; everyday questions get none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server.pipeline.safety import SAFETY_NOTE, names_a_hazard, with_safety_note
from server.pipeline.seams import ReplyRequest, TurnTrace
from server.pipeline.voice import VoicePipeline
from server.runtime.conditions import Conditions
from server.runtime.history import CacheClass, ContextEntry, Role
from tests.support.stand_ins import stand_in_pipeline

QUESTIONS = Path(__file__).parents[3] / "benchmarks/data/questions.json"


@pytest.mark.parametrize(
    "words",
    [
        "How many ibuprofen tablets can I take?",  # medicine
        "my son burned his arm on the oven what do i do",  # first aid
        "Is it safe to touch a live wire with rubber gloves?",  # electricity
        "I smell gas in the kitchen.",  # fire and gas
        "Can I mix BLEACH with vinegar?",  # poisons, any case
    ],
)
def test_hazards_of_each_topic_are_named(words: str) -> None:
    assert names_a_hazard(words)


@pytest.mark.parametrize(
    "words",
    ["What is the capital of Brazil?", "How do I boil an egg?", "Tell me a joke.", "outburst"],
)
def test_everyday_words_name_none(words: str) -> None:
    assert not names_a_hazard(words)


def test_no_everyday_question_of_the_benchmark_set_gets_the_note() -> None:
    """The tuning and held-out questions (benchmarks/answers_bench.py) are asked as before."""
    questions = json.loads(QUESTIONS.read_text())["questions"]
    everyday = [q["q"] for q in questions if q["split"] != "safety"]
    assert len(everyday) >= 70
    assert [q for q in everyday if names_a_hazard(q)] == []


def test_the_note_follows_the_users_last_words_only() -> None:
    chat: list[dict[str, Any]] = [
        {"role": "system", "content": "persona"},
        {"role": "user", "content": "Should I pull him off the live wire?"},
    ]
    assert with_safety_note(chat) == [*chat, {"role": "system", "content": SAFETY_NOTE}]
    assert len(chat) == 2  # not changed in place
    answered = [*chat, {"role": "assistant", "content": "No."}]
    assert with_safety_note(answered) == answered  # not a user's turn last
    assert with_safety_note([]) == []


class _Recording:
    """ASR, TTS and LLM stand-ins; the LLM records each prompt it is given."""

    def __init__(self, takes_safety_note: bool = True) -> None:
        self.prompts: list[tuple[str, list[Any]]] = []
        self.takes_safety_note = takes_safety_note

    async def stream(
        self, messages: Any, request_id: str, max_tokens: int, *, cache_salt: str | None = None
    ) -> Any:
        self.prompts.append(("reply", list(messages)))
        yield "Call emergency services."

    async def prefill(
        self, messages: Any, request_id: str, *, cache_salt: str | None = None
    ) -> Any:
        self.prompts.append(("prefill", list(messages)))
        raise ConnectionError("no warm-up here")

    async def abort(self, request_id: str) -> None:
        pass

    def last_stats(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("takes_it", [True, False])
async def test_the_reply_is_asked_with_the_note_and_the_warm_up_without(takes_it: bool) -> None:
    """Only a model that follows the note gets it (a small one reads it aloud)."""
    engines = _Recording(takes_it)
    pipeline: VoicePipeline = stand_in_pipeline(engines)
    context = (
        ContextEntry(CacheClass.ANCHOR, Role.SYSTEM, "persona"),
        ContextEntry(CacheClass.CURRENT, Role.USER, "My kid swallowed a button battery."),
    )
    request = ReplyRequest("s" * 32, 0, context, Conditions("p", "joe", "a"))
    try:
        await pipeline.prefill(request)
        said = [piece async for piece in pipeline.reply(request, TurnTrace(endpoint_ms=0))]
    finally:
        await pipeline.close()
    assert said == ["Call emergency services."]
    (warm_kind, warm), (reply_kind, reply) = engines.prompts
    assert (warm_kind, reply_kind) == ("prefill", "reply")
    note = [{"role": "system", "content": SAFETY_NOTE}] if takes_it else []
    assert reply == [*warm, *note]
