"""A chunk's speech in pieces: the shared speech engine gives a reply's first chunk piece by
piece (``Speaker``), each piece is queued for playback as it comes with its mouth shapes
(``Voicing``), and the chunk is complete with its last piece."""

from __future__ import annotations

import functools
import itertools
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from server.avatar.lipsync import LipSync, VisemeCue, cues_for
from server.avatar.seam import Viseme
from server.clock import FakeClock
from server.config import PipelineConfig, RuntimeConfig
from server.conversation.voicing import Voicing
from server.pipeline.chunks import SpeechTime
from server.pipeline.seams import SpeechAudio, TurnTrace, speech_pieces
from server.pipeline.speaker import CONTENTION
from server.pipeline.voice import VoicePipeline
from server.runtime.chunk import PhonemeTiming
from server.runtime.conditions import Conditions
from server.runtime.session import Session
from server.runtime.session_view import SessionView
from server.scheduling.engine_queue import JobTag
from tests.support.stand_ins import stand_in_pipeline
from tests.support.tone_pipeline import tone, tone_phonemes

CONDITIONS = Conditions("p", "joe", "a")


@dataclass(frozen=True)
class _Piece:
    pcm: npt.NDArray[np.int16]
    words: tuple[()] = ()
    phonemes: tuple[tuple[str, int, int], ...] = ()
    last: bool = True


class _PiecesTts:
    """Says every text as 300 ms of tone, whole or in three pieces of 100 ms (each piece
    takes 40 ms of ``clock``'s time)."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.calls: list[str] = []
        self.paces: list[float | None] = []
        self.clock = clock

    def synthesize(self, text: str) -> _Piece:
        self.calls.append("whole")
        return _Piece(tone(300), phonemes=(("a", 0, 14_400),))

    def pieces(self, text: str, pace: float | None) -> Iterator[_Piece]:
        self.calls.append("pieces")
        self.paces.append(pace)
        pcm = tone(300)
        for i in range(3):
            if self.clock is not None:
                self.clock.advance(40.0)
            timings = (("a", 0, 14_400),) if i == 0 else ()
            yield _Piece(pcm[i * 4800 : (i + 1) * 4800], phonemes=timings, last=i == 2)

    def transcribe(self, pcm: object, prefix: str = "") -> str:
        return ""

    async def close(self) -> None:
        pass


def _tag(slack_ms: float) -> JobTag:
    return JobTag("s" * 32, 0, functools.partial(SessionView, "s" * 32, 0, slack_ms, 2000.0))


async def _said(pipeline: VoicePipeline, slack_ms: float) -> list[SpeechAudio]:
    return [p async for p in speech_pieces(pipeline, "Hello there.", CONDITIONS, _tag(slack_ms))]


async def test_a_chunk_the_playback_waits_for_comes_in_pieces_and_one_with_time_whole() -> None:
    tts = _PiecesTts()
    pipeline = stand_in_pipeline(tts)
    pipeline.speech_time = SpeechTime(6.0)  # 12 characters: 72 ms expected
    try:
        first = await _said(pipeline, 0.0)  # nothing queued: a reply's first chunk
        ahead = await _said(pipeline, 1500.0)  # 1.5 s queued ahead of the cursor
        await _said(pipeline, 0.0)
    finally:
        await pipeline.close()
    assert tts.calls == ["pieces", "whole", "pieces"]
    # the engine sizes the pieces by the pace of the speech made so far (none at first)
    assert tts.paces[0] is None and tts.paces[1] is not None and tts.paces[1] >= 0
    assert [len(p.pcm) for p in first] == [4800, 4800, 4800]
    assert [p.last for p in first] == [False, False, True]
    assert first[0].phonemes[0].end == 14_400 and first[1].phonemes == ()
    assert [len(p.pcm) for p in ahead] == [14_400] and ahead[0].last


def test_the_cues_of_pieces_are_the_chunks_cut_at_the_joins() -> None:
    pcm = tone(1000)
    phonemes = tone_phonemes(len(pcm))
    whole = cues_for(phonemes, pcm)
    joins = [0, 7_000, 20_000, len(pcm)]  # a join inside a phoneme's slot
    pieces = [cues_for(phonemes, pcm[a:b], a) for a, b in itertools.pairwise(joins)]
    cut = [cue for piece in pieces for cue in piece]
    assert cut[0].start == 0 and cut[-1].end == len(pcm)
    assert all(a.end == b.start for a, b in itertools.pairwise(cut))

    def viseme_at(cues: Sequence[VisemeCue], sample: int) -> Viseme:
        return next(c.viseme for c in cues if c.start <= sample < c.end)

    for sample in range(0, len(pcm), 480):
        assert viseme_at(cut, sample) == viseme_at(whole, sample)
    assert cues_for(phonemes, pcm[:0], 48_000) == ()


async def test_each_piece_is_queued_as_it_comes_and_the_last_completes_the_chunk() -> None:
    clock, lipsync = FakeClock(), LipSync()
    session = Session("s" * 16, RuntimeConfig(), clock)
    session.submit_text("hello")
    assert session.start_response(session.epoch)
    chunk = session.open_chunk(session.epoch, "Hello world.")
    assert chunk is not None
    pcm = tone(300)
    phonemes = tuple(PhonemeTiming(p.phoneme, p.start, p.end) for p in tone_phonemes(len(pcm)))
    seen: list[tuple[int, bool, int]] = []  # the chunk's audio and cues before each piece

    async def pieces() -> AsyncGenerator[SpeechAudio, None]:
        for i in range(3):
            state = session.chunk(chunk.chunk_id)
            cues = lipsync._chunks.get(chunk.chunk_id)
            seen.append((state.duration, state.audio_complete, len(cues.cues) if cues else 0))
            timings = phonemes if i == 0 else ()
            yield SpeechAudio(pcm[i * 4800 : (i + 1) * 4800], (), timings, last=i == 2)

    announced: list[int] = []

    async def room() -> None:
        pass

    voicing = Voicing(session, lipsync, clock, announced.append, room)
    trace = TurnTrace(endpoint_ms=0)
    assert await voicing.deliver(chunk, pieces(), 5.0, trace)
    done = session.chunk(chunk.chunk_id)
    assert [s[:2] for s in seen] == [(0, False), (4800, False), (9600, False)]
    assert seen[1][2] >= 1 and seen[2][2] > seen[1][2]  # cues added with each piece
    assert done.duration == len(pcm) and done.audio_complete
    assert done.phonemes == phonemes  # the first piece's timings stay the chunk's
    assert announced == [chunk.chunk_id] * 3 and trace.first_tts_ms is not None
    placed = lipsync._chunks[chunk.chunk_id].cues
    assert placed[0].start == 0 and placed[-1].end == len(pcm)


async def test_the_warm_up_times_the_first_piece_and_gives_the_whole_speech() -> None:
    clock = FakeClock()
    tts = _PiecesTts(clock)
    pipeline = stand_in_pipeline(tts, clock)
    try:
        speech, first_ms = await pipeline._speaker.warm_up("Hello there.", _tag(0.0))
    finally:
        await pipeline.close()
    assert first_ms == 40.0  # the first of three pieces, 40 ms each
    assert tts.paces == [0.0]  # alone at start: as soon as it can
    assert pipeline._speaker.pace == 120.0 / 300.0  # 300 ms of speech made in 120 ms
    # in a conversation the stages have half the CPU (the calibration's share), and the LLM
    # writes on meanwhile: speech is expected to be made more slowly until a chunk measures it
    pipeline.tune(PipelineConfig(), stage_share=0.5)
    assert pipeline._speaker.pace == 0.4 * CONTENTION / 0.5
    assert len(speech.pcm) == 14_400 and speech.phonemes[0].end == 14_400 and speech.last
