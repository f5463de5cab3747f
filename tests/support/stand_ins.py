"""The real voice pipeline on stand-in engines: the tests' engines answer at once, so that the
pipeline's own logic (queues, chunking, speech in pieces, warm-up) is what is tested."""

from __future__ import annotations

from typing import Any

from models.tts import split_sentences
from server.clock import Clock
from server.pipeline.voice import VoicePipeline


def stand_in_pipeline(engines: Any, clock: Clock | None = None) -> VoicePipeline:
    """``VoicePipeline`` whose ASR, LLM and TTS are all ``engines`` (each test's stand-in
    implements what it needs of them), 10 tokens a reply, a first chunk of 6 words."""
    return VoicePipeline(
        engines,
        engines,
        engines,
        split_sentences,
        max_tokens=10,
        first_chunk_words=6,
        clock=clock,
    )
