"""Whisper ASR and Piper TTS with the bundled models (real inference on CPU, no mocks)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest

from models.asr import FULL_WINDOW_S, WhisperAsr, Window, cut_loop
from models.tts import (
    RATE_HZ,
    PiperTts,
    Speech,
    _word_times,
    flush_sentences,
    split_sentences,
)
from server.runtime.media import resample
from tests.support.text import edit_distance

SENTENCES = (
    "The weather is sunny today.",
    "Please open the window in the kitchen.",
    "My favourite colour is blue.",
)
HOP_48K = 256 * 48_000 / 22_050  # one step of the voice's duration predictor, in 48 kHz samples


@pytest.fixture(scope="module")
def tts() -> PiperTts:
    return PiperTts()


@pytest.fixture(scope="module")
def asr() -> Iterator[WhisperAsr]:
    yield WhisperAsr(cpu_threads=2)


# Whisper tiny.en writes American spelling (as Whisper's own English text normaliser does,
# count British and American spellings as the same word)
SPELLING = {"favourite": "favorite", "colour": "color"}


def words_of(text: str) -> list[str]:
    """Lowercased words without punctuation, in American spelling."""
    words = re.sub(r"[^\w\s']", " ", text.lower()).split()
    return [SPELLING.get(w, w) for w in words]


def test_edit_distance() -> None:
    assert edit_distance(words_of("a b c"), words_of("A, b c.")) == 0
    assert edit_distance(words_of("a b c"), words_of("a x c d")) == 2
    assert edit_distance([], words_of("a b")) == 2


def test_tts_to_asr_round_trip(tts: PiperTts, asr: WhisperAsr) -> None:
    errors = total = 0
    heard = []
    for sentence in SENTENCES:
        text = asr.transcribe(resample(tts.synthesize(sentence).pcm, RATE_HZ, 16_000))
        heard.append(text)
        errors += edit_distance(words_of(sentence), words_of(text))
        total += len(words_of(sentence))
    wer = errors / total
    assert wer <= 0.25, (wer, heard)


def test_asr_window_follows_the_audio() -> None:
    # 16 kHz samples -> 10 ms mel frames: the utterance and 1 s of silence, at least 3 s,
    # at most Whisper's 30 s; "full" is always 30 s
    assert Window("audio").frames(16_000) == 300
    assert Window("audio").frames(4 * 16_000) == 500
    assert Window("audio").frames(60 * 16_000) == 3000
    assert Window("full").frames(16_000) == int(FULL_WINDOW_S * 100)
    assert all(Window("audio").frames(n) % 2 == 0 for n in range(0, 80_000, 777))


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("What is the capital of France? What is the capital of", "What is the capital of France?"),
        ("How far away is the moon? How far away the", "How far away is the moon?"),
        ("Tell me a joke about cats Tell me a joke about", "Tell me a joke about cats"),
        ("the land of the land of the land of the", "the land of"),
        # legitimate repetitions stay
        ("What is it? What is that?", "What is it? What is that?"),
        ("What is the capital and what is the population?", None),
        ("What is the capital of France and what is the capital of Spain?", None),
        ("Hello.", None),
    ],
)
def test_cut_loop(text: str, kept: str | None) -> None:
    assert cut_loop(text) == (kept or text)


def test_asr_continues_after_a_prefix(tts: PiperTts, asr: WhisperAsr) -> None:
    sentence = "Please open the window in the kitchen."
    pcm = resample(tts.synthesize(sentence).pcm, RATE_HZ, 16_000)
    heard = asr.transcribe(pcm, prefix="Please open the")
    assert heard.startswith("Please open the ")
    assert edit_distance(words_of(sentence), words_of(heard)) <= 1, heard


def test_asr_hears_nothing_in_silence_and_noise(asr: WhisperAsr) -> None:
    rng = np.random.default_rng(1)
    assert asr.transcribe(np.zeros(16_000, np.int16)) == ""
    assert asr.transcribe((rng.standard_normal(32_000) * 200).astype(np.int16)) == ""
    assert asr.transcribe(np.zeros(0, np.int16)) == ""


def test_asr_audio_window_is_about_as_accurate_as_the_full_window(
    tts: PiperTts, asr: WhisperAsr
) -> None:
    """The same synthesized audio through both windows. Piper's synthesis is random, and the
    shorter window slips on a word now and then (24 runs: "colors blue" every time, "wethers"
    once), so the bound is a word error rate over all sentences, not an exact match."""
    full = WhisperAsr(cpu_threads=1, window="full")
    errors = {"audio": 0, "full": 0}
    heard: list[tuple[str, str]] = []
    for sentence in SENTENCES:
        pcm = resample(tts.synthesize(sentence).pcm, RATE_HZ, 16_000)
        for name, model in (("audio", asr), ("full", full)):
            text = model.transcribe(pcm)
            heard.append((name, text))
            errors[name] += edit_distance(words_of(sentence), words_of(text))
    total = sum(len(words_of(s)) for s in SENTENCES)
    assert errors["full"] / total <= 0.25, heard
    assert errors["audio"] / total <= 0.35, heard


def assert_timings(speech: Speech, words: int) -> None:
    n = len(speech.pcm)
    assert n > 0 and speech.pcm.dtype == np.int16
    # phonemes tile the audio: contiguous from 0 to the last sample
    starts = [s for _, s, _ in speech.phonemes]
    ends = [e for _, _, e in speech.phonemes]
    assert starts[0] == 0 and ends[-1] == n
    assert starts[1:] == ends[:-1]
    assert sum(e - s for _, s, e in speech.phonemes) == n
    assert abs(n - round(n / HOP_48K) * HOP_48K) <= 2  # 22,050 Hz audio = whole hops, resampled
    # each phoneme lasts whole steps of the duration predictor (256 samples at 22,050 Hz):
    # the counts are the model's alignment, scaled to 48 kHz with rounding only
    for _, s, e in speech.phonemes:
        assert abs((e - s) / HOP_48K - round((e - s) / HOP_48K)) * HOP_48K <= 2
    # words: as many as in the text, monotonic, inside the audio, covering most of it
    assert len(speech.words) == words
    previous_end = 0
    for word in speech.words:
        assert previous_end <= word.start <= word.end <= n
        previous_end = word.end
    assert all(w.end > w.start for w in speech.words)
    spoken = sum(w.end - w.start for w in speech.words)
    assert spoken >= 0.6 * n, (spoken, n)
    assert speech.words[0].start < 0.3 * RATE_HZ
    assert speech.words[-1].end > n - 0.5 * RATE_HZ
    # the audio before the first word is (nearly) silent next to the words' audio
    level = np.abs(speech.pcm.astype(np.int32))
    voiced = level[speech.words[0].start : speech.words[-1].end].mean()
    assert level[: speech.words[0].start].mean() < voiced / 4


@pytest.mark.parametrize(
    "text",
    [
        "The weather is sunny today.",  # one phoneme run per word
        "Please open the window in the kitchen.",  # espeak merges "in the" into one run
        "Hello there. How are you doing today? I am fine, thank you!",  # several chunks
        "Mr. Smith paid $3.14 for 2 apples, e.g. red ones.",  # words that expand when spoken
    ],
)
def test_tts_alignment(tts: PiperTts, text: str) -> None:
    speech = tts.synthesize(text)
    assert_timings(speech, len(text.split()))
    assert [w.word for w in speech.words] == text.split()
    # word edges fall on phoneme edges (from the alignment, not a proportional guess)
    edges = {s for _, s, _ in speech.phonemes} | {len(speech.pcm)}
    assert all(w.start in edges and w.end in edges for w in speech.words)


def test_tts_numbers_take_their_spoken_time(tts: PiperTts) -> None:
    speech = tts.synthesize("Mr. Smith paid $3.14 for 2 apples.")
    by_word = {w.word: w.end - w.start for w in speech.words}
    # "dollar three point one four" lasts far longer than "paid"
    assert by_word["$3.14"] > 3 * by_word["paid"]


def test_tts_blank_text_is_empty(tts: PiperTts) -> None:
    for text in ("", "   \n"):
        speech = tts.synthesize(text)
        assert len(speech.pcm) == 0 and speech.words == () and speech.phonemes == ()


def test_word_times_fall_back_to_letter_counts() -> None:
    # two phoneme runs for three words and no per-word counts: spread by letters
    phonemes = [("^", 0, 100), ("a", 100, 400), (" ", 400, 500), ("b", 500, 1100)]
    phonemes.append(("$", 1100, 1200))
    timed = _word_times(["aa", "b", "cccccc"], phonemes, None)
    assert [w for w, _, _ in timed] == ["aa", "b", "cccccc"]
    assert timed[0][1] == 100 and timed[-1][2] == 1100
    previous = 0
    for _, start, end in timed:
        assert previous <= start <= end
        previous = end
    assert (timed[2][2] - timed[2][1]) > 2 * (timed[0][2] - timed[0][1])


def test_word_times_one_run_per_word() -> None:
    # no per-word spelling: as many runs as words, each word takes its run and the space after
    phonemes = [("^", 0, 100), ("a", 100, 400), (" ", 400, 500), ("b", 500, 1100)]
    phonemes.append(("$", 1100, 1200))
    assert _word_times(["x", "y"], phonemes, None) == [("x", 100, 500), ("y", 500, 1100)]


def test_word_times_align_spelled_words() -> None:
    # "in the" spoken as one run; "2" spelled differently from how it was spoken
    spoken = "inthe tuu kats"
    phonemes, t = [("^", 0, 10)], 10
    for p in spoken:
        phonemes.append((p, t, t + 10))
        t += 10
    phonemes.append(("$", t, t + 10))
    spelled = [list("in"), list("the"), list("tuw"), list("kats")]
    timed = _word_times(["in", "the", "2", "cats."], phonemes, spelled)
    # a word owns the space after it
    assert timed == [("in", 10, 30), ("the", 30, 70), ("2", 70, 110), ("cats.", 110, 150)]


@pytest.mark.parametrize(
    ("buffer", "sentences", "tail"),
    [
        ("Hello there. How are", ["Hello there."], "How are"),
        ("Really? Yes! Fine. ", ["Really?", "Yes!", "Fine."], ""),
        ("It costs 3.14 euros. And", ["It costs 3.14 euros."], "And"),
        ("It costs 3.", [], "It costs 3."),  # "3." may continue as "3.14"
        ("Ask Mr. Smith or Dr. Jones. Ok", ["Ask Mr. Smith or Dr. Jones."], "Ok"),
        ("Fruit, e.g. apples, i.e. food. Then", ["Fruit, e.g. apples, i.e. food."], "Then"),
        ("Bring pens, paper, etc. and ink. So", ["Bring pens, paper, etc. and ink."], "So"),
        ("Well... I think so. Then", ["Well... I think so."], "Then"),
        ("Wait\u2026 what? Ok", ["Wait\u2026 what?"], "Ok"),
        ('He said "stop." Then', ['He said "stop."'], "Then"),
        ("Short, clause", [], "Short, clause"),
        (
            "When you get to the end of the long road, turn left",
            ["When you get to the end of the long road,"],
            "turn left",
        ),
        ("Steps:\n1. Open it.\n2. Close", ["Steps:", "1. Open it."], "2. Close"),
        ("That is all. 42. Yes", ["That is all.", "42."], "Yes"),
        ("A 1,000 euro fee; paid on time by all of the members. Ok", None, "Ok"),
        ("", [], ""),
    ],
)
def test_split_sentences(buffer: str, sentences: list[str] | None, tail: str) -> None:
    got, rest = split_sentences(buffer)
    if sentences is not None:
        assert got == sentences
    assert rest.strip() == tail
    assert buffer.endswith(rest)
    assert " ".join([*got, rest]).split() == buffer.split()  # nothing lost or added


def test_split_sentences_streamed_matches_whole() -> None:
    text = "Hi there. Dr. Who paid 3.14 euros, which is cheap. It was 42. See:\n1. A list. Done"
    pieces: list[str] = []
    buffer = ""
    for i in range(0, len(text), 3):  # arrives three characters at a time
        done, buffer = split_sentences(buffer + text[i : i + 3])
        pieces.extend(done)
    pieces.extend(flush_sentences(buffer))
    assert pieces == [
        "Hi there.",
        "Dr. Who paid 3.14 euros, which is cheap.",
        "It was 42.",
        "See:",
        "1. A list.",
        "Done",
    ]
    assert pieces == flush_sentences(text)


def test_flush_sentences() -> None:
    assert flush_sentences("One. Two") == ["One.", "Two"]
    assert flush_sentences("Mr.") == ["Mr."]
    assert flush_sentences("  ") == []
    assert flush_sentences("...") == []


def test_silence_is_no_text(asr: WhisperAsr) -> None:
    assert asr.transcribe(np.zeros(16_000, np.int16)) == ""
    assert asr.transcribe(np.zeros(0, np.int16)) == ""
    quiet_noise = np.random.default_rng(1).normal(0, 30, 32_000).astype(np.int16)
    assert asr.transcribe(quiet_noise) == ""


def test_asr_rejects_stereo(asr: WhisperAsr) -> None:
    with pytest.raises(ValueError, match="mono"):
        asr.transcribe(np.zeros((2, 160), np.int16))
