"""The TTS benchmark: its scoring, and a quick run of the server's engine (real models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.tts_bench import QUICK, REPLIES, main, score, words
from models.tts import flush_sentences


def test_words_are_compared_without_case_punctuation_or_number_spelling() -> None:
    said = ["it", "costs", "15", "dollars", "which", "is", "cheap"]
    assert words("It costs $15, which is cheap!") == said
    assert words("Eight legs") == words("8 legs.") == ["8", "legs"]
    assert words("I'm fine") == ["i'm", "fine"]


def test_score_is_the_word_error_rate_over_the_set() -> None:
    wer, misses = score(["the cat sat", "a dog"], ["The cat sat.", "a big dog"])
    assert wer == pytest.approx(1 / 5)
    assert misses == ["'a dog' -> 'a big dog'"]
    assert score([], []) == (0.0, [])


def test_the_quick_set_is_one_sentence_per_reply() -> None:
    assert all(len(flush_sentences(reply)) == 1 for reply in REPLIES[:QUICK])
    assert len(REPLIES) >= 20


@pytest.mark.e2e  # the voice and Whisper tiny.en, a few seconds
def test_quick_run_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "tts.json"
    assert main(["--quick", "--engines", "onnx", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    figures = result["onnx"]
    assert figures["sentences"] == QUICK and 0 < figures["rtf_p50"] < 1
    assert figures["wer"] <= 0.25, figures["misheard"]
    assert result["machine"]["cores"] >= 1 and "piper" not in result
