"""The voice in two parts: windows of the decoder give the whole decode's audio, so a reply's
first sentence can be heard after its first window instead of after all of it."""

from __future__ import annotations

import itertools

import numpy as np

from models.tts import OnnxVoiceTts
from models.voice_graph import (
    CONTEXT_FRAMES,
    GROWTH,
    HOP_SAMPLES,
    MAX_PACE,
    Window,
    head_for_pace,
    head_frames,
    windows,
)

TEXT = "The capital of France is Paris, a city on the Seine. It is lovely in spring."


def test_windows_tile_the_frames_with_context_and_grow() -> None:
    plan = windows(300, 21)
    assert [(w.start, w.end) for w in plan] == [(0, 21), (21, 84), (84, 273), (273, 300)]
    assert all(a.end == b.start for a, b in itertools.pairwise(plan))
    for window in plan:
        assert window.lo == max(0, window.start - CONTEXT_FRAMES)
        assert window.hi == min(300, window.end + CONTEXT_FRAMES)
    # a short tail joins the window before it; few frames or no head: one window
    assert [(w.start, w.end) for w in windows(90, 21)] == [(0, 21), (21, 90)]  # 21, x3, rest
    assert windows(40, 21) == [Window(0, 40, 0, 40)]
    assert windows(500, None) == [Window(0, 500, 0, 500)]
    assert windows(0, 21) == []


def test_the_head_outlasts_the_next_windows_decode_at_the_pace_of_late() -> None:
    assert head_for_pace(0.0, 22_050) == 21  # HEAD_MS at the least
    assert head_for_pace(0.1, 22_050) == 21
    head = head_for_pace(0.25, 22_050)
    assert head is not None and head > 21
    # the second window (GROWTH x the head, and its context) is made before the head plays out
    assert 0.25 * (GROWTH * head + 2 * CONTEXT_FRAMES) <= head
    assert head_for_pace(MAX_PACE, 22_050) is None  # too slow for pieces to help
    assert head_for_pace(None, 22_050) is None


def test_a_window_emits_its_own_samples() -> None:
    window = Window(21, 84, 5, 100)
    assert window.emitted() == slice(16 * HOP_SAMPLES, 79 * HOP_SAMPLES)
    assert head_frames(22_050, 240.0) == 21  # 21 x 256 samples = 244 ms


def _snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    error = np.sum((reference.astype(np.float64) - other) ** 2)
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / max(error, 1.0)))


def test_pieces_join_into_the_whole_speech() -> None:
    """Two voices with one seed draw the same noise: one says the text whole, the other in
    pieces. The pieces join into the same audio (within a sample's rounding), the first
    holds the text's timings and about a quarter of a second, only the last says so."""
    whole = OnnxVoiceTts(threads=1, seed=5, cache_dir=None).synthesize(TEXT)
    pieces = list(OnnxVoiceTts(threads=1, seed=5, cache_dir=None).pieces(TEXT, 0.0))
    joined = np.concatenate([p.pcm for p in pieces])
    assert len(pieces) >= 3
    assert len(joined) == len(whole.pcm)
    assert _snr_db(whole.pcm, joined) > 60
    assert np.max(np.abs(whole.pcm.astype(np.int32) - joined)) <= 2
    assert pieces[0].words == whole.words and pieces[0].phonemes == whole.phonemes
    assert all(p.words == () and p.phonemes == () for p in pieces[1:])
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert 0.2 * 48_000 < len(pieces[0].pcm) < 0.3 * 48_000
    assert whole.phonemes[-1][2] == len(whole.pcm)  # the timings end where the audio does


def test_blank_text_has_no_pieces_and_a_short_one_is_one_piece() -> None:
    voice = OnnxVoiceTts(threads=1, seed=5, cache_dir=None)
    assert list(voice.pieces("  ")) == []
    (only,) = list(voice.pieces("Hi."))
    assert only.last and len(only.pcm) == only.phonemes[-1][2]
    # speech made too slowly lately for pieces to help: each of the two sentences whole
    whole = list(voice.pieces(TEXT, MAX_PACE))
    assert [p.last for p in whole] == [False, True]
    assert sum(len(p.pcm) for p in whole) == whole[0].phonemes[-1][2]
