"""A reply pipeline with real speech and a scripted story: Whisper tiny.en hears the user,
Piper speaks, and the "LLM" always tells the same story (STORY), a few words at a time.

For tests that check what the client heard against what was said: the received audio is
transcribed and compared with STORY. Selected with ``pipeline.factory=
tests.support.story_pipeline:create``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

from models.asr import WhisperAsr
from models.llm import Message
from models.tts import OnnxVoiceTts, split_sentences
from server.config import Config
from server.pipeline.voice import VoicePipeline

STORY = (
    "Once a red fox lived near a quiet river.",
    "Every morning the fox walked to the old mill.",
    "There a baker gave him warm bread and honey.",
    "One winter the river froze and the mill stopped.",
    "The fox carried wood to the baker for the fire.",
    "In spring the wheel turned again and they both laughed.",
    "Now the children of the village tell this story at night.",
    "And the fox still visits the mill every single morning.",
)


class StoryLlm:
    """Streams STORY a word at a time (10 ms apart), whatever it is asked."""

    async def prefill_open(
        self,
        messages: Sequence[Message],
        request_id: str,
        *,
        cache_salt: str | None = None,
        paused: bool = False,
    ) -> Any:
        return SimpleNamespace(cached_tokens=0)

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> Any:
        return SimpleNamespace(cached_tokens=0)

    async def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncIterator[str]:
        for sentence in STORY:
            for word in sentence.split():
                await asyncio.sleep(0.01)
                yield word + " "

    async def abort(self, request_id: str) -> None:
        pass

    def last_stats(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        pass


def create(config: Config) -> VoicePipeline:
    return VoicePipeline(
        WhisperAsr(cpu_threads=1),
        StoryLlm(),
        OnnxVoiceTts(threads=1),
        split_sentences,
        max_tokens=400,
        first_chunk_words=config.pipeline.first_chunk_words,
        scheduler_config=config.scheduler,
    )
