"""What the LLM engine tests ask and read: a conversation with a long system prompt (the tiny
model's training text), a stream's deltas, a request's statistics."""

from __future__ import annotations

from collections.abc import AsyncIterator

from models.llm import GenerationStats, LlmEngine, Message
from tests.support.tiny_llama import TEXT


def chat(tag: str, question: str = "Tell me a story about a cat.") -> list[Message]:
    """A conversation whose long system prompt (> 3 KV blocks) starts with ``tag``."""
    return [
        {"role": "system", "content": f"{tag}. {TEXT}"},
        {"role": "user", "content": question},
    ]


async def collect(stream: AsyncIterator[str]) -> list[str]:
    return [delta async for delta in stream]


def stats_of(engine: LlmEngine, request_id: str) -> GenerationStats:
    stats = engine.last_stats(request_id)
    assert stats is not None, f"no stats for {request_id}"
    return stats
