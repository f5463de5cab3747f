"""The voice pipeline: speech recognition, a language model and speech synthesis as one
:class:`~server.pipeline.TurnPipeline`.

The engines are seams (structural Protocols below): this module knows no particular model.
CPU-heavy calls (ASR, TTS) run in worker threads, never on the event loop; the LLM streams.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from server.chunk import PhonemeTiming, WordTiming
from server.conditions import Conditions
from server.history import ContextEntry
from server.pipeline import ReplyRequest, SpeechAudio, TurnTrace

log = logging.getLogger(__name__)

Message = dict[str, str]
Splitter = Callable[[str], tuple[list[str], str]]


class Asr(Protocol):
    def transcribe(self, pcm: npt.NDArray[np.int16]) -> str: ...


class Llm(Protocol):
    def stream(
        self, messages: Sequence[Message], request_id: str, max_tokens: int
    ) -> AsyncIterator[str]: ...

    async def prefill(self, messages: Sequence[Message], request_id: str) -> Any: ...

    async def abort(self, request_id: str) -> None: ...

    def last_stats(self, request_id: str) -> Any: ...

    async def close(self) -> None: ...


class WordLike(Protocol):
    @property
    def word(self) -> str: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


class SpeechLike(Protocol):
    @property
    def pcm(self) -> npt.NDArray[np.int16]: ...

    @property
    def words(self) -> Sequence[WordLike]: ...

    @property
    def phonemes(self) -> Sequence[tuple[str, int, int]]: ...


class Tts(Protocol):
    def synthesize(self, text: str) -> SpeechLike: ...


def to_messages(context: Sequence[ContextEntry]) -> list[Message]:
    """Context entries (anchor, recent window, current turn) as chat messages."""
    return [{"role": entry.role.value, "content": entry.text} for entry in context]


def now_ms() -> float:
    return time.monotonic() * 1000


class FirstChunkCutter:
    """Chunks streamed text: sentences from ``splitter``; the reply's first chunk is cut early,
    after ``first_words`` words, so that speech can start before the first sentence ends."""

    def __init__(self, splitter: Splitter, first_words: int) -> None:
        self._split = splitter
        self._first_words = first_words
        self._buffer = ""
        self._first = True

    def feed(self, delta: str) -> list[str]:
        self._buffer += delta
        chunks, self._buffer = self._split(self._buffer)
        if self._first and not chunks:
            words = self._buffer.split(" ")
            # a word is complete once a space follows it
            if len(words) > self._first_words:
                chunks = [" ".join(words[: self._first_words])]
                self._buffer = " ".join(words[self._first_words :])
        chunks = [c.strip() for c in chunks if c.strip()]
        if chunks:
            self._first = False
        return chunks

    def flush(self) -> list[str]:
        tail, self._buffer = self._buffer.strip(), ""
        return [tail] if tail else []


class VoicePipeline:
    """ASR -> LLM -> TTS behind the TurnPipeline seam, shared by every session."""

    def __init__(
        self,
        asr: Asr,
        llm: Llm,
        tts: Tts,
        splitter: Splitter,
        *,
        max_tokens: int,
        first_chunk_words: int,
    ) -> None:
        self._asr = asr
        self._llm = llm
        self._tts = tts
        self._splitter = splitter
        self._max_tokens = max_tokens
        self._first_chunk_words = first_chunk_words
        self._asr_pool = ThreadPoolExecutor(1, thread_name_prefix="asr")
        self._tts_pool = ThreadPoolExecutor(1, thread_name_prefix="tts")
        self._ids = itertools.count(1)

    async def transcribe(self, utterance: npt.NDArray[np.int16]) -> str:
        if len(utterance) < 1600:  # < 100 ms: not a word
            return ""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._asr_pool, self._asr.transcribe, utterance)

    async def partial_transcript(self, utterance: npt.NDArray[np.int16]) -> str:
        return await self.transcribe(utterance)

    async def prefill(self, request: ReplyRequest) -> int:
        rid = f"{request.session_id[:8]}-warm-{next(self._ids)}"
        stats = await self._llm.prefill(to_messages(request.context), rid)
        return int(stats.cached_tokens)

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[str]:
        rid = f"{request.session_id[:8]}-e{request.epoch}-{next(self._ids)}"
        cutter = FirstChunkCutter(self._splitter, self._first_chunk_words)
        stream = self._llm.stream(to_messages(request.context), rid, self._max_tokens)
        try:
            async for delta in stream:
                if trace.llm_first_token_ms is None:
                    trace.llm_first_token_ms = now_ms()
                for chunk in cutter.feed(delta):
                    if trace.first_chunk_text_ms is None:
                        trace.first_chunk_text_ms = now_ms()
                    yield chunk
            for chunk in cutter.flush():
                if trace.first_chunk_text_ms is None:
                    trace.first_chunk_text_ms = now_ms()
                yield chunk
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                await closer()  # a cancelled reply aborts its request
            stats = self._llm.last_stats(rid)
            if stats is not None:
                trace.cached_tokens = int(stats.cached_tokens)
                trace.prompt_tokens = int(stats.prompt_tokens)

    async def synthesize(self, text: str, conditions: Conditions) -> SpeechAudio:
        loop = asyncio.get_running_loop()
        speech = await loop.run_in_executor(self._tts_pool, self._tts.synthesize, text)
        words = tuple(WordTiming(w.word, w.start, max(w.start, w.end)) for w in speech.words)
        phonemes = tuple(
            PhonemeTiming(p, start, max(start, end)) for p, start, end in speech.phonemes
        )
        return SpeechAudio(np.asarray(speech.pcm, np.int16), words, phonemes)

    async def close(self) -> None:
        await self._llm.close()
        self._asr_pool.shutdown(wait=True, cancel_futures=True)
        self._tts_pool.shutdown(wait=True, cancel_futures=True)
