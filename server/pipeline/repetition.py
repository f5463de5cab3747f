"""A stop rule for replies that repeat themselves (a small model's loop: "açaí, açaí, açaí").

Pure text logic: given the reply so far, where it should have ended. Words are compared with
case and punctuation aside.
"""

from __future__ import annotations

import re
import unicodedata

WORD = re.compile(r"\S+")
MAX_PHRASE_WORDS = 12  # the longest phrase looked for
REPEATS = 3  # a phrase said this many times in a row is a loop
REPEATS_OF_ONE_WORD = 4  # "no, no, no" is English; four times is a loop


def normalise_word(word: str) -> str:
    """A word case-folded, without punctuation or symbols."""
    folded = unicodedata.normalize("NFKC", word).casefold()
    return "".join(ch for ch in folded if ch.isalnum())


def loop_end(text: str) -> int | None:
    """Where ``text`` should end when its complete words end in a phrase (1 to
    MAX_PHRASE_WORDS words) said REPEATS times in a row (a single word REPEATS_OF_ONE_WORD
    times): the character index after the phrase's first saying, from where the repetition
    began. None when it does not."""
    complete = text if text[-1:].isspace() else text[: max(text.rfind(" "), 0)]
    spans = [m.span() for m in WORD.finditer(complete)]
    words = [normalise_word(complete[a:b]) for a, b in spans]
    for size in range(1, MAX_PHRASE_WORDS + 1):
        times = REPEATS_OF_ONE_WORD if size == 1 else REPEATS
        if len(words) < size * times:
            break
        tail = words[-size:]
        if not any(tail):
            continue
        end = len(words)
        if all(words[end - (k + 1) * size : end - k * size] == tail for k in range(times)):
            start = end - size  # back to where the repetition began (any phase of the phrase)
            while start > 0 and words[start - 1] == words[start - 1 + size]:
                start -= 1
            return spans[start + size - 1][1]
    return None
