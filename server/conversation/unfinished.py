"""The words at a pause: whether what the user said so far stops mid-sentence.

The end-of-turn model (Smart Turn) hears prosody, and a speaker who pauses after "I would like
to go to" often sounds done. The recogniser's transcript of the same pause, which the partial
loop decodes anyway (it is usually the final transcript), says otherwise: it ends on a word
that cannot end an English sentence (an article, most prepositions, a conjunction, a
possessive, a filler) or trails off with no final mark. Such words keep the turn open for the
longer silence (``vad.incomplete_silence_ms``) even where the model called it complete. Words
that end complete sentences as often as unfinished ones (modals: "Yes, I can."; particles:
"Hold on."; "that") are left to the model: a wrong "unfinished" costs the user a slower turn,
not a cut-off, but slows short answers.
"""

from __future__ import annotations

import enum
import re

DANGLING = frozenset(
    {
        # articles and possessives
        *("a", "an", "the", "my", "your", "our", "their"),
        # prepositions that end no sentence but a stranded one ("What is it for?" waits longer)
        *("to", "of", "for", "with", "from", "at", "about", "into", "than", "between", "toward"),
        # conjunctions and a subject pronoun
        *("and", "or", "but", "because", "if", "although", "whether", "nor", "i"),
        # fillers: the speaker is thinking
        *("um", "uh", "er", "erm", "uhm", "hmm"),
    }
)
TRAILING = ("...", "…", ",", "-", "—", ":", ";")  # the recogniser heard the voice trail off
FINAL_MARKS = (".", "?", "!")
WORD = re.compile(r"[a-z']+")


class Words(enum.Enum):
    """What the words at a pause say about ending the turn."""

    END = "end"  # nothing against ending it
    WAIT = "wait"  # the decode of the pause is still coming
    UNFINISHED = "unfinished"  # keep the turn open


def sounds_unfinished(text: str) -> bool:
    """Whether a transcript stops mid-sentence: it trails off (an ellipsis, a comma, a dash),
    has no final mark, or ends on a word from ``DANGLING``. An empty one says nothing."""
    text = text.strip()
    if not text:
        return False
    if text.endswith(TRAILING) or not text.endswith(FINAL_MARKS):
        return True
    words = WORD.findall(text.lower())
    return bool(words) and words[-1] in DANGLING


def words_at_pause(
    covered: int, text: str, pause_start: int, quiet_ms: float, coming: bool, cap_ms: float
) -> Words:
    """The verdict of the latest partial transcript on a pause that began at ``pause_start``
    (16 kHz samples into the utterance): it heard all the speech (``covered`` samples) and its
    ``text`` sounds unfinished or not; else wait while the pause's decode is ``coming`` (the
    partial loop decodes at a pause) for up to ``cap_ms`` of quiet, then end without words (a
    slow recogniser's decode is the final transcript anyway; partials are shed under load)."""
    if covered >= pause_start > 0:
        return Words.UNFINISHED if sounds_unfinished(text) else Words.END
    if coming and quiet_ms < cap_ms:
        return Words.WAIT
    return Words.END
