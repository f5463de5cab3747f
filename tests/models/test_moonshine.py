"""Moonshine tiny (models.moonshine) with the weights moonshine-voice 0.1.0 ships: real inference
on CPU, no mocks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from models.asr import LONGEST_S as WHISPER_LONGEST_S
from models.asr import AsrError, WhisperAsr
from models.long_speech import InPieces
from models.moonshine import (
    LONGEST_S,
    MODEL_FILES,
    MoonshineAsr,
    MoonshineWithWhisper,
    moonshine_model_dir,
    verify,
)
from models.tts import OnnxVoiceTts
from server.pipeline.resample import resample
from server.pipeline.wiring import recogniser
from tests.support.recognisers import (
    KITCHEN,
    SENTENCES,
    best_of_three_wer,
    check_continues_after_a_pause,
    check_continues_after_a_prefix,
    check_last_word_rivals,
    said,
    words_of,
)
from tests.support.speech import speak
from tests.support.text import edit_distance


@pytest.fixture(scope="module")
def tts() -> OnnxVoiceTts:
    return OnnxVoiceTts(seed=7)


@pytest.fixture(scope="module")
def moonshine() -> MoonshineAsr:
    return MoonshineAsr(cpu_threads=1)


def test_the_packaged_files_are_the_ones_checked() -> None:
    folder = moonshine_model_dir()
    verify(folder)
    assert sorted(p.name for p in folder.iterdir() if p.name in MODEL_FILES) == sorted(MODEL_FILES)


def test_a_changed_file_fails_the_check(tmp_path: Path) -> None:
    for name in MODEL_FILES:
        shutil.copy(moonshine_model_dir() / name, tmp_path / name)
    data = bytearray((tmp_path / "tokenizer.bin").read_bytes())
    data[100] ^= 1
    (tmp_path / "tokenizer.bin").write_bytes(bytes(data))
    with pytest.raises(AsrError, match=r"tokenizer\.bin: sha256"):
        verify(tmp_path)


def test_the_vocabulary_reads_and_writes_text(moonshine: MoonshineAsr) -> None:
    tokens = moonshine.tokens
    assert len(tokens.pieces) == 32_768
    for text in ("What is the capital of France?", "Café au lait, 42 times!"):
        assert tokens.decode(tokens.encode(text)) == text
    # whole words are one token each where the vocabulary has them
    assert len(tokens.encode("What is the capital of")) == 5
    assert tokens.decode([1, *tokens.encode("Hello there"), 2]) == "Hello there"  # no <s>, </s>


def test_moonshine_round_trip(tts: OnnxVoiceTts, moonshine: MoonshineAsr) -> None:
    wer, heard = best_of_three_wer(moonshine, tts, SENTENCES, words_of)
    assert wer <= 0.25, heard


def test_moonshine_continues_after_a_prefix(tts: OnnxVoiceTts, moonshine: MoonshineAsr) -> None:
    check_continues_after_a_prefix(moonshine, tts)


def test_moonshine_continues_after_a_pause_without_reading_it_twice(
    tts: OnnxVoiceTts, moonshine: MoonshineAsr
) -> None:
    check_continues_after_a_pause(moonshine, tts)


def test_moonshine_tells_the_words_it_weighed_in_place_of_the_last_one(
    tts: OnnxVoiceTts, moonshine: MoonshineAsr
) -> None:
    check_last_word_rivals(moonshine, said(tts, KITCHEN))


def test_moonshine_takes_any_length_and_rejects_stereo(moonshine: MoonshineAsr) -> None:
    assert moonshine.transcribe(np.zeros(0, np.int16)) == ""
    moonshine.transcribe(np.zeros(400, np.int16))  # 25 ms: padded to what the encoder needs
    with pytest.raises(ValueError, match="mono"):
        moonshine.transcribe(np.zeros((2, 16_000), np.int16))


@pytest.fixture(scope="module")
def paired(moonshine: MoonshineAsr) -> MoonshineWithWhisper:
    return MoonshineWithWhisper(moonshine, WhisperAsr(cpu_threads=1), cross_check=False)


def test_the_pair_hears_speech_with_moonshine_and_no_words_in_short_noise(
    tts: OnnxVoiceTts, moonshine: MoonshineAsr, paired: MoonshineWithWhisper
) -> None:
    rng = np.random.default_rng(3)
    burst = np.zeros(9_600, np.int16)  # a cough-like burst of noise in 0.6 s
    burst[1_600:4_800] = rng.standard_normal(3_200) * 3_000 * np.exp(-np.arange(3_200) / 800)
    assert moonshine.transcribe(burst) != ""  # Moonshine invents a word ...
    assert paired.transcribe(burst) == "" and paired.hear(burst) == ("", ())  # ... Whisper not
    pcm = said(tts, KITCHEN)
    assert paired.hear(pcm) == moonshine.hear(pcm)
    assert paired.transcribe(pcm, "Please open") == moonshine.transcribe(pcm, "Please open")
    assert paired.transcribe_after(pcm, "Mm-hm.") == paired.whisper.transcribe_after(pcm, "Mm-hm.")


def test_the_setting_picks_the_recogniser() -> None:
    whisper = recogniser("whisper-tiny.en", 1, "audio")
    assert isinstance(whisper, InPieces) and isinstance(whisper.asr, WhisperAsr)
    assert whisper.longest == WHISPER_LONGEST_S * 16_000
    pieces = recogniser("moonshine-tiny", 1, "audio")
    assert isinstance(pieces, InPieces) and pieces.longest == LONGEST_S * 16_000
    made = pieces.asr
    assert isinstance(made, MoonshineWithWhisper) and made.cross_check
    assert isinstance(made.whisper, WhisperAsr) and made.whisper.window.mode == "audio"


# espeak-ng's robotic voice, which each model mishears in other places (2026-12-07, at 165
# words a minute: Moonshine "What should I look for dinner tonight?", "I would like to work a
# table for two people.", Whisper "How do plant stern sunlight into food?")
ROBOTIC = (
    "What should I cook for dinner tonight?",
    "I would like to book a table for two people.",
    "Please speak a little more slowly.",
    "How many days are there in a week?",
    "How long should I boil an egg for a soft yolk?",
    "What is a mammal?",
    "Why is the sky blue during the day?",
    "How do plants turn sunlight into food?",
)


def test_the_cross_check_keeps_the_text_both_models_find_likelier(
    moonshine: MoonshineAsr, paired: MoonshineWithWhisper
) -> None:
    whisper = paired.whisper
    checked = MoonshineWithWhisper(moonshine, whisper, cross_check=True)
    errors = {"moonshine": 0, "whisper": 0, "pair": 0}
    for sentence in ROBOTIC:
        pcm = resample(speak(sentence, rate=165), 48_000, 16_000)
        alone, other = moonshine.transcribe(pcm), whisper.transcribe(pcm)
        picked = checked.transcribe(pcm)
        assert picked in (alone, other)
        if words_of(alone) != words_of(other):  # the likelier of the two, both models summed
            scores = {t: moonshine.score(pcm, t) + whisper.score(pcm, t) for t in (alone, other)}
            assert scores[picked] == max(scores.values()), scores
        for name, text in (("moonshine", alone), ("whisper", other), ("pair", picked)):
            errors[name] += edit_distance(words_of(sentence), words_of(text))
    print(f"word errors on {len(ROBOTIC)} espeak-ng clips: {errors}")
    assert errors["pair"] < min(errors["moonshine"], errors["whisper"]), errors
