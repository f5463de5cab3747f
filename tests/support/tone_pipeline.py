"""A deterministic reply pipeline for transport tests: replies are tones of a known length.

Never the server's default; tests select it with ``--set pipeline.factory=
tests.support.tone_pipeline:create``. ``TONE_PIPELINE_MS`` sets each sentence's length (ms) and
``TONE_PIPELINE_SENTENCES`` how many sentences a reply has, ``TONE_PIPELINE_THINK_MS`` how long
the first sentence takes to come (a slow first token; default 0).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt

from server.config import Config
from server.pipeline.seams import ReplyPiece, ReplyRequest, SpeechAudio, Transcript, TurnTrace
from server.runtime.chunk import PhonemeTiming, WordTiming
from server.runtime.conditions import Conditions
from server.runtime.history import Role
from server.runtime.media import ms_to_samples
from server.runtime.tools import FunctionCall
from server.scheduling.engine_queue import JobTag

TONE_HZ = 440.0
AMPLITUDE = 8000


def tone(ms: float) -> npt.NDArray[np.int16]:
    n = ms_to_samples(ms)
    t = np.arange(n) / 48_000
    pcm = (AMPLITUDE * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.int16)
    fade = min(n // 2, 240)  # 5 ms ramps: no click at the edges
    ramp = np.linspace(0.0, 1.0, fade)
    pcm[:fade] = (pcm[:fade] * ramp).astype(np.int16)
    pcm[n - fade :] = (pcm[n - fade :] * ramp[::-1]).astype(np.int16)
    return pcm


PHONEMES = ("h", "ə", "l", "oʊ", "w", "ɜ", "m", "a")  # IPA
LOUDNESS = (0.35, 1.0, 0.55, 0.9, 0.45, 0.8, 0.3, 1.0)  # of each phoneme: vowels loudest
PHONEME_SAMPLES = 4800  # 100 ms each


def speechlike(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    """The tone with a syllable rhythm: each 100 ms phoneme slot at its LOUDNESS (5 ms ramps),
    so the audio envelope and the lip-sync cues rise and fall together."""
    slots = np.arange(len(pcm)) // PHONEME_SAMPLES % len(LOUDNESS)
    envelope = np.asarray(LOUDNESS)[slots]
    envelope = np.convolve(envelope, np.ones(240) / 240, mode="same")
    return (pcm * envelope).astype(np.int16)


def tone_phonemes(samples: int) -> tuple[PhonemeTiming, ...]:
    """Phoneme timings for a tone: 100 ms slots cycling through PHONEMES (for lip-sync)."""
    return tuple(
        PhonemeTiming(PHONEMES[i % len(PHONEMES)], start, min(samples, start + PHONEME_SAMPLES))
        for i, start in enumerate(range(0, samples, PHONEME_SAMPLES))
    )


class TonePipeline:
    def __init__(self, sentence_ms: float, sentences: int, think_ms: float = 0.0) -> None:
        self.sentence_ms = sentence_ms
        self.sentences = sentences
        self.think_ms = think_ms

    async def transcribe(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> str:
        return f"utterance of {len(utterance) * 1000 // 16_000} ms"

    async def partial_transcript(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> Transcript:
        return Transcript(await self.transcribe(utterance, tag))

    async def prefill(self, request: ReplyRequest, *, paused: bool = False) -> int:
        return 0  # no engine, nothing cached

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[ReplyPiece]:
        await asyncio.sleep(self.think_ms / 1000)
        for i in range(self.sentences):
            yield f"Tone number {i + 1} for epoch {request.epoch}."

    async def synthesize(self, text: str, conditions: Conditions, tag: JobTag) -> SpeechAudio:
        pcm = speechlike(tone(self.sentence_ms))
        words = text.split()
        per = len(pcm) // len(words)
        timings = tuple(WordTiming(w, i * per, (i + 1) * per) for i, w in enumerate(words))
        return SpeechAudio(pcm, timings, tone_phonemes(len(pcm)))

    async def close(self) -> None:
        pass


def create(config: Config) -> TonePipeline:
    return TonePipeline(
        float(os.environ.get("TONE_PIPELINE_MS", "1500")),
        int(os.environ.get("TONE_PIPELINE_SENTENCES", "2")),
        float(os.environ.get("TONE_PIPELINE_THINK_MS", "0")),
    )


class FlakyTonePipeline(TonePipeline):
    """Every other reply's speech engine raises: for engine-failure tests."""

    def __init__(self, sentence_ms: float, sentences: int) -> None:
        super().__init__(sentence_ms, sentences)
        self.replies = 0

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[ReplyPiece]:
        self.replies += 1
        async for sentence in super().reply(request, trace):
            yield sentence

    async def synthesize(self, text: str, conditions: Conditions, tag: JobTag) -> SpeechAudio:
        if self.replies % 2 == 1:
            raise RuntimeError("speech engine crashed")
        return await super().synthesize(text, conditions, tag)


def create_flaky(config: Config) -> FlakyTonePipeline:
    return FlakyTonePipeline(500.0, 1)


class InstructedTonePipeline(TonePipeline):
    """Its first sentence says which instructions it was given (the system prompt of the
    request, at most 12 words): for tests that the persona and per-reply instructions reach
    the LLM stage. ``requests``: every request it was given, in order."""

    def __init__(self, sentence_ms: float, sentences: int, think_ms: float = 0.0) -> None:
        super().__init__(sentence_ms, sentences, think_ms)
        self.requests: list[ReplyRequest] = []

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[ReplyPiece]:
        self.requests.append(request)
        anchor = request.context[0].text if request.context else ""
        yield "As told: " + " ".join(anchor.split()[:12])
        async for sentence in super().reply(request, trace):
            yield sentence


def create_instructed(config: Config) -> InstructedTonePipeline:
    return InstructedTonePipeline(
        float(os.environ.get("TONE_PIPELINE_MS", "1500")),
        int(os.environ.get("TONE_PIPELINE_SENTENCES", "2")),
        float(os.environ.get("TONE_PIPELINE_THINK_MS", "0")),
    )


class CallingTonePipeline(InstructedTonePipeline):
    """A scripted stand-in for an LLM that calls tools, for deterministic tests of the
    function-call flow (the real model's calls: tests/models/test_tool_calls.py). Offered
    tools and last asked by the user, it says ``preamble`` (if any) and calls the first tool
    offered (the choice's, when it names one) with ``arguments``; ``calls`` > 1 makes that
    many calls. After a call's output it says "The tool said <output>." Otherwise it talks as
    its parent does."""

    def __init__(
        self,
        sentence_ms: float,
        sentences: int,
        preamble: str = "",
        arguments: str = "{}",
        calls: int = 1,
    ) -> None:
        super().__init__(sentence_ms, sentences)
        self.preamble = preamble
        self.arguments = arguments
        self.calls = calls
        self.made = 0  # calls made so far (each call's id is new)

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[ReplyPiece]:
        self.requests.append(request)
        last = request.context[-1] if request.context else None
        if last is not None and last.call_id:
            yield f"The tool said {last.text}."
            return
        if not request.tools.callable or last is None or last.role is not Role.USER:
            async for sentence in TonePipeline.reply(self, request, trace):
                yield sentence
            return
        if self.preamble:
            yield self.preamble
        name = request.tools.choice.name or request.tools.tools[0].name
        for _ in range(self.calls):
            self.made += 1
            yield FunctionCall(f"call_test{self.made}", name, self.arguments)


def create_calling(config: Config) -> CallingTonePipeline:
    return CallingTonePipeline(
        float(os.environ.get("TONE_PIPELINE_MS", "600")),
        1,
        os.environ.get("TONE_PIPELINE_PREAMBLE", ""),
    )
