"""What the tests ask of every speech recogniser (models.asr.WhisperAsr, models.moonshine)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from models.asr import RIVALS
from models.tts import RATE_HZ, OnnxVoiceTts
from server.conversation.unfinished import Bars, stranded
from server.pipeline.resample import resample
from tests.support.text import edit_distance

KITCHEN = "Please open the window in the kitchen."
SENTENCES = ("The weather is sunny today.", KITCHEN, "My favourite colour is blue.")  # round trips


def words_of(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() else " " for c in text).split()


def said(tts: OnnxVoiceTts, text: str) -> npt.NDArray[np.int16]:
    """``text`` in the joe voice at 16 kHz, as a recogniser hears it."""
    return resample(tts.synthesize(text).pcm, RATE_HZ, 16_000)


def best_of_three_wer(
    asr: Any, tts: OnnxVoiceTts, sentences: tuple[str, ...], words: Callable[[str], list[str]]
) -> tuple[float, list[str]]:
    """Word error rate of ``asr`` on ``sentences`` in the joe voice (``words`` splits a text
    into the words compared), and what it heard. The voice samples noise (VITS): Whisper tiny
    once heard a clean take of a sentence as "The WOtherSSSSSSSS"; each sentence counts its
    best of three takes."""
    errors = total = 0
    heard = []
    for sentence in sentences:
        takes = [asr.transcribe(said(tts, sentence)) for _ in range(3)]
        text = min(takes, key=lambda t: edit_distance(words(sentence), words(t)))
        heard.append(text)
        errors += edit_distance(words(sentence), words(text))
        total += len(words(sentence))
    return errors / total, heard


def check_continues_after_a_prefix(asr: Any, tts: OnnxVoiceTts) -> None:
    heard = asr.transcribe(said(tts, KITCHEN), prefix="Please open the")
    assert heard.startswith("Please open the ")
    assert edit_distance(words_of(KITCHEN), words_of(heard)) <= 1, heard


def check_continues_after_a_pause(asr: Any, tts: OnnxVoiceTts) -> None:
    """The stable words of the partials at a mid-sentence pause end in a mark ("should I?");
    forced on the decoder as they were, Whisper read "Drink every day? Drink every"."""
    pause = np.zeros(9600, np.int16)  # 600 ms at 16 kHz
    parts = [said(tts, t) for t in ("How much water should I", "drink every day?")]
    pcm = np.concatenate([parts[0], pause, parts[1]])
    heard = asr.transcribe(pcm, prefix="How much water should I?")
    assert heard.startswith("How much water should I "), heard
    assert words_of(heard).count("drink") == 1, heard
    assert words_of(heard)[-3:] == ["drink", "every", "day"], heard


def check_last_word_rivals(asr: Any, pcm: npt.NDArray[np.int16]) -> None:
    """``asr`` hears ``pcm`` (KITCHEN said) with its last word clear: a few rivals of little
    share, best first, none a word that ends no sentence; also after forced words."""
    heard = asr.hear(pcm)
    assert heard.text == asr.transcribe(pcm)
    assert words_of(heard.text)[-1] == "kitchen", heard
    shares = [p for _, p in heard.last_word_rivals]
    assert 0 < len(shares) <= RIVALS and shares == sorted(shares, reverse=True)
    assert 0.0 < sum(shares) < 0.5  # a clearly heard word: its rivals share little
    # and none is a word that ends no sentence: the turn may end on this one
    assert stranded(heard.text, heard.last_word_rivals) < Bars().stranded, heard
    after = asr.hear(pcm, prefix="Please open the")  # the last word decoded after forced ones
    assert words_of(after.text)[-1] == "kitchen" and after.last_word_rivals, after
