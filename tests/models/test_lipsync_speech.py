"""Lip-sync cues from real speech (the joe voice): on the phoneme timings, open mouths where it
is loud; every symbol the TTS emits has a sensible mouth shape."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from models.tts import OnnxVoiceTts
from server.avatar.lipsync import LENGTH, STRESS, WORD_GAP, cues_for
from server.avatar.seam import VISEME_OPENING, Viseme, viseme_of
from server.runtime.chunk import PhonemeTiming

SENTENCE = "Hello there, how are you doing on this fine morning?"


@pytest.fixture(scope="module")
def tts() -> OnnxVoiceTts:
    return OnnxVoiceTts()


@pytest.fixture(scope="module")
def speech(tts: OnnxVoiceTts) -> tuple[np.ndarray, tuple[PhonemeTiming, ...]]:
    spoken = tts.synthesize(SENTENCE)
    phonemes = tuple(PhonemeTiming(p, s, e) for p, s, e in spoken.phonemes)
    return spoken.pcm, phonemes


def test_cues_sit_on_phoneme_boundaries_and_tile_the_audio(
    speech: tuple[np.ndarray, tuple[PhonemeTiming, ...]],
) -> None:
    pcm, phonemes = speech
    cues = cues_for(phonemes, pcm)
    boundaries = {p.start for p in phonemes} | {p.end for p in phonemes}
    assert all(c.start in boundaries and c.end in boundaries for c in cues)
    assert cues[0].start == 0 and cues[-1].end == len(pcm)
    assert all(a.end == b.start for a, b in itertools.pairwise(cues))
    assert all(a.viseme is not b.viseme for a, b in itertools.pairwise(cues))
    shapes = {c.viseme for c in cues}
    assert {Viseme.AA, Viseme.O, Viseme.E, Viseme.NN, Viseme.SIL} <= shapes  # "hello ... how"
    assert len(shapes) >= 8


def test_open_visemes_are_the_loud_parts(
    speech: tuple[np.ndarray, tuple[PhonemeTiming, ...]],
) -> None:
    pcm, phonemes = speech
    cues = cues_for(phonemes, pcm)
    audio = pcm.astype(np.float64)

    def rms(start: int, end: int) -> float:
        return float(np.sqrt(np.mean(audio[start:end] ** 2)))

    wide = [rms(c.start, c.end) for c in cues if VISEME_OPENING[c.viseme] >= 0.6]
    shut = [rms(c.start, c.end) for c in cues if VISEME_OPENING[c.viseme] == 0.0]
    assert np.median(wide) > 2 * np.median(shut)
    # weights follow loudness within the sounding cues
    sounding = [c for c in cues if c.viseme is not Viseme.SIL]
    loudness = [rms(c.start, c.end) for c in sounding]
    weights = [c.weight for c in sounding]
    assert np.corrcoef(loudness, weights)[0, 1] > 0.5


PAUSES = frozenset("^$,.;:?!")


def test_every_symbol_the_voice_speaks_has_a_mouth_shape(tts: OnnxVoiceTts) -> None:
    text = (
        "Sure, I can help you with that! The weather is lovely; my sister thinks it's 30 degrees."
        " Which judge measured the thoughtful bird's usual voice? Yes: the church's new tower."
    )
    symbols = {p for p, _, _ in tts.synthesize(text).phonemes}
    marks = {*STRESS, LENGTH, WORD_GAP}
    sounds = symbols - PAUSES - marks
    assert len(sounds) >= 30
    silent = sorted(s for s in sounds if viseme_of(s) is Viseme.SIL)
    assert not silent, silent  # a sound shown as a closed, resting mouth
    assert all(viseme_of(p) is Viseme.SIL for p in symbols & PAUSES)
    assert symbols <= sounds | PAUSES | marks
