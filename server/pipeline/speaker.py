"""A chunk's text to speech through the shared speech engine: whole, or in pieces where the
session's playback would run dry before the whole is ready (a reply's first chunk always is)
and the engine makes speech fast enough for pieces to help (its pace).

A piece is one job of the engine's queue, so sessions take turns between pieces; the first
holds the chunk's word and phoneme timings, the last says so (``SpeechAudio.last``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import replace

import numpy as np

from server.clock import Clock
from server.pipeline.chunks import SpeechTime
from server.pipeline.engines import SpeechLike, SpeechPieceLike, Tts, TtsInPieces
from server.pipeline.seams import SpeechAudio
from server.runtime.chunk import PhonemeTiming, WordTiming
from server.runtime.media import MEDIA_RATE_HZ
from server.runtime.stage import Stage
from server.scheduling.engine_queue import EngineQueue, JobTag

TTS_COST_MS_PER_CHAR = 1.5  # Piper, real-time factor ~0.03 at ~15 characters a second
TTS_COST_MS_FIXED = 20.0
PACE_WEIGHT = 0.3  # of the latest chunk in the running pace
# how much slower speech is made in a conversation than alone at start, beside the CPU the
# calibration gives the session's media path and video (measured, realtime_bench: 1.2-1.6x
# on a fast 2-core host, 1.8-4x in the slow profile, where the LLM writes on meanwhile)
CONTENTION = 1.5


def speech_audio(speech: SpeechLike, last: bool = True) -> SpeechAudio:
    """The engine's speech as the runtime takes it (timings with end >= start)."""
    words = tuple(WordTiming(w.word, w.start, max(w.start, w.end)) for w in speech.words)
    phonemes = tuple(PhonemeTiming(p, start, max(start, end)) for p, start, end in speech.phonemes)
    return SpeechAudio(np.asarray(speech.pcm, np.int16), words, phonemes, last)


class Speaker:
    """Speech for chunks of every session, through ``queue`` (the TTS engine's worker).

    ``speech_time`` gives the pipeline's running estimate of how long a chunk takes to become
    audio (ms per character); each chunk spoken updates it. ``pace``: how long speech took
    to make lately over its duration (the waits for the engine included; None until the
    warm-up): the engine sizes a chunk's pieces by it, so that the playback does not run dry
    between two of them.
    """

    def __init__(
        self, tts: Tts, queue: EngineQueue, clock: Clock, speech_time: Callable[[], SpeechTime]
    ) -> None:
        self._tts = tts
        self._queue = queue
        self._clock = clock
        self._speech_time = speech_time
        self.pace: float | None = None

    def expect(self, stage_share: float) -> None:
        """Speech in a conversation is made with ``stage_share`` of the CPU the warm-up had,
        beside the LLM writing on: until a chunk measures it, the pace measured alone
        stretches by ``CONTENTION`` / that."""
        if self.pace is not None and stage_share > 0:
            self.pace *= CONTENTION / stage_share

    def _observe(self, text: str, took_ms: float, samples: int) -> None:
        """``text`` became ``samples`` of audio in ``took_ms``."""
        self._speech_time().observe(len(text), took_ms)
        if samples <= 0:
            return
        latest = took_ms / (samples / (MEDIA_RATE_HZ / 1000))
        old = self.pace
        self.pace = latest if old is None else old + PACE_WEIGHT * (latest - old)

    async def whole(self, text: str, tag: JobTag) -> SpeechAudio:
        """Speech for ``text`` in one piece."""
        cost = TTS_COST_MS_PER_CHAR * len(text) + TTS_COST_MS_FIXED
        job = functools.partial(self._tts.synthesize, text)
        asked = self._clock.now_ms()
        speech = await self._queue.run(tag, Stage.TTS, cost, job)
        said = speech_audio(speech)
        self._observe(text, self._clock.now_ms() - asked, len(said.pcm))
        return said

    def urgent(self, text: str, tag: JobTag) -> bool:
        """Whether the session's playback would run dry before ``text`` is spoken whole."""
        return self._speech_time().runs_dry(tag.view().slack_ms, text)

    async def warm_up(self, text: str, tag: JobTag) -> tuple[SpeechAudio, float | None]:
        """The engine's first call: ``text`` said (in pieces where the engine can, in one
        job), and the time (ms) to its first piece (None: said whole)."""
        tts, clock = self._tts, self._clock
        if not isinstance(tts, TtsInPieces):
            return await self.whole(text, tag), None

        def say() -> tuple[SpeechAudio, float | None]:
            started, first_ms = clock.now_ms(), None
            made = []
            for piece in tts.pieces(text, 0.0):  # alone: as soon as it can
                first_ms = clock.now_ms() - started if first_ms is None else first_ms
                made.append(speech_audio(piece))
            if not made:
                return SpeechAudio(np.zeros(0, np.int16)), None
            return replace(made[0], pcm=np.concatenate([p.pcm for p in made])), first_ms

        asked = self._clock.now_ms()
        said, first_ms = await self._queue.run(tag, Stage.TTS, TTS_COST_MS_FIXED, say)
        self._observe(text, self._clock.now_ms() - asked, len(said.pcm))
        return said, first_ms

    async def pieces(self, text: str, tag: JobTag) -> AsyncGenerator[SpeechAudio, None]:
        """Speech for ``text``: in pieces if it is urgent and the engine can, else whole.
        The time the pieces' jobs took (queued and run, not the caller's time between them)
        is what the chunk is observed to have taken."""
        tts = self._tts
        if not isinstance(tts, TtsInPieces) or not self.urgent(text, tag):
            yield await self.whole(text, tag)
            return
        made: Iterator[SpeechPieceLike] = iter(tts.pieces(text, self.pace))
        step: Callable[[], SpeechPieceLike | None] = functools.partial(next, made, None)
        cost = TTS_COST_MS_PER_CHAR * len(text) + TTS_COST_MS_FIXED
        took, samples = 0.0, 0
        while True:
            asked = self._clock.now_ms()
            piece = await self._queue.run(tag, Stage.TTS, cost, step)
            took += self._clock.now_ms() - asked
            if piece is None:  # nothing to say (or no piece said it was the last)
                yield SpeechAudio(np.zeros(0, np.int16))
                break
            samples += len(piece.pcm)
            yield speech_audio(piece, piece.last)
            if piece.last:
                break
            cost = TTS_COST_MS_PER_CHAR * len(text)  # what is left is decoding
        self._observe(text, took, samples)
