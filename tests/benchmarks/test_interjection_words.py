"""The offline interjection benchmark: its clips, its scoring, and a quick run (real Whisper)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.interjection_words import (
    RATE,
    REPLY,
    clips_of,
    espeak,
    main,
    opus_round_trip,
    over_reply,
    score,
    stops,
)
from server.config import VadConfig
from server.conversation.interjection import INTERJECTION_CONTEXT, PREROLL_MS
from server.pipeline.echo_gate import ONSET_FRAMES, WORDS_HOLD_FRAMES
from tests.support.speech import loud_frames


def voice(ms: float, before_ms: float = 300.0, after_ms: float = 500.0) -> np.ndarray:
    """A loud tone of ``ms`` between silences (16 kHz)."""
    t = np.arange(int(ms * RATE / 1000)) / RATE
    tone = (8000 * np.sin(2 * np.pi * 200 * t)).astype(np.int16)
    gap = np.zeros(int(before_ms * RATE / 1000), np.int16)
    return np.concatenate([gap, tone, np.zeros(int(after_ms * RATE / 1000), np.int16)])


def test_a_short_phrase_is_heard_once_from_the_preroll_to_the_quiet() -> None:
    vad = VadConfig()
    clips = clips_of(voice(400), vad)
    assert clips.going_on is None
    expected_ms = PREROLL_MS + 400 + vad.interjection_quiet_ms
    assert abs(len(clips.final) * 1000 / RATE - expected_ms) <= 1
    assert not clips.final[: int(PREROLL_MS * RATE / 1000) - 16].any()  # the preroll is quiet


def test_a_long_phrase_is_also_heard_while_it_goes_on() -> None:
    vad = VadConfig()
    clips = clips_of(voice(vad.interruption_ms + 300, before_ms=20), vad)
    assert clips.going_on is not None
    assert len(clips.going_on) == int((PREROLL_MS + vad.interruption_ms) * RATE / 1000)
    assert np.array_equal(clips.going_on, clips.final[: len(clips.going_on)])


def test_the_reply_stops_where_any_hearing_takes_the_floor() -> None:
    assert not stops(["Mm-hm."]) and not stops(["Okay.", "Oh, okay."])
    assert stops(["Okay.", "Okay, tell me about Paris."]) and stops(["Wait."])
    trials = [
        {"text": "Mm-hm.", "real": False, "voice": "v", "speed": 1, "heard": {"": ["Mm-hm."]}},
        {"text": "Hey.", "real": True, "voice": "v", "speed": 1, "heard": {"": ["Okay."]}},
        {"text": "Stop.", "real": True, "voice": "v", "speed": 1, "heard": {"": ["Stop."]}},
    ]
    for trial in trials:
        trial["ms"] = {"": 10.0}
    figures = score(trials, "")
    assert (figures["backchannels_resumed"], figures["backchannels"]) == (1, 1)
    assert (figures["interruptions_stopped"], figures["interruptions"]) == (1, 2)
    assert figures["missed"] == ["Hey. (v, 1): ['Okay.']"]


def test_the_opus_round_trip_keeps_the_sound() -> None:
    tone = np.repeat(voice(500, 100, 100), 3)  # at 48 kHz, the shape is all that matters here
    back = opus_round_trip(tone)
    assert abs(len(back) - len(tone) // 3) <= 960
    assert np.abs(back.astype(np.int32)).max() > 2000


def test_a_hum_over_a_sessions_first_reply_reaches_the_recogniser_whole() -> None:
    # through the real canceller (AEC3): before the echo gate knows that nothing comes back,
    # its output has silent 20 ms frames in the middle of the user's hum; the words hold
    # gives the recogniser what was heard there
    reply, phrase = espeak(REPLY, "en-us", 175), espeak("Mm-hm.", "en", 175)
    silent = {}
    for hold in (WORDS_HOLD_FRAMES, 0):
        got = over_reply(phrase, reply, 300, False, (hold, 0))
        first, last = got.span
        assert first == 300 * RATE // 1000 and 300 < (last - first) * 1000 / RATE < 1000
        silent[hold] = loud_frames(got.pcm[first:last], 30.0, 320).count(False)  # 20 ms
    assert silent[0] >= silent[WORDS_HOLD_FRAMES] + 5


def test_a_soft_first_sound_over_a_sessions_first_reply_reaches_the_recogniser() -> None:
    # "Sure." opens with a soft "sh" below the echo's bound: AEC3, with no echo path found,
    # damps it; the onset's rewind gives the recogniser what was heard before the first loud
    # frame (ONSET_FRAMES of it)
    reply, phrase = espeak(REPLY, "en-us", 175), espeak("Sure.", "en-us", 175)
    got = {}
    for onset in (ONSET_FRAMES, 0):
        heard = over_reply(phrase, reply, 300, False, (WORDS_HOLD_FRAMES, onset))
        got[onset] = heard.pcm
    diff = np.flatnonzero(got[ONSET_FRAMES] != got[0])
    assert len(diff) and diff[-1] - diff[0] < ONSET_FRAMES * 160  # within the onset only
    before = got[0][diff[0] : diff[-1] + 1].astype(np.float64)
    after = got[ONSET_FRAMES][diff[0] : diff[-1] + 1].astype(np.float64)
    assert np.sqrt(np.mean(after**2)) > 3 * np.sqrt(np.mean(before**2))  # louder: as heard


@pytest.mark.e2e  # espeak-ng and Whisper tiny.en, about ten seconds
def test_quick_run_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "words.json"
    assert main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    primed = result["summary"][INTERJECTION_CONTEXT]
    assert primed["backchannels"] == 16 and primed["interruptions"] == 24
    # Whisper tiny mishears some; most must still be told apart
    assert primed["backchannels_resumed"] >= 12 and primed["interruptions_stopped"] >= 18
    assert "(none)" in result["summary"] and result["machine"]["cores"] >= 1


@pytest.mark.e2e  # espeak-ng, the joe voice, AEC3 and Whisper tiny.en, about half a minute
def test_quick_run_over_a_reply_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "over.json"
    assert main(["--quick", "--over-reply", "--out", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert len(summary) == 3  # the first scene: the words hold with its onset, alone, neither
    assert all(s["backchannels"] == 16 and s["interruptions"] == 24 for s in summary.values())

    def told_apart(arm: str) -> int:
        return int(summary[arm]["backchannels_resumed"] + summary[arm]["interruptions_stopped"])

    hold = f"start 300 ms, words hold {WORDS_HOLD_FRAMES}"
    assert told_apart(f"{hold}, onset 0") >= told_apart("start 300 ms, words hold 0, onset 0")
    assert told_apart(f"{hold}, onset {ONSET_FRAMES}") >= told_apart(f"{hold}, onset 0")
