"""What the tests ask of every speech recogniser (models.asr.WhisperAsr, models.moonshine)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from models.asr import RIVALS
from server.conversation.unfinished import Bars, stranded

KITCHEN = "Please open the window in the kitchen."


def words_of(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() else " " for c in text).split()


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
