"""The words at a pause: whether what the user said so far stops mid-sentence.

The end-of-turn model (Smart Turn) hears prosody, and a speaker who pauses after "I would like
to go to" often sounds done. The recogniser's transcript of the same pause, which the partial
loop decodes anyway (it is usually the final transcript), says otherwise: it ends on a word
that cannot end an English sentence (an article, most prepositions, a conjunction, a
possessive, a filler: the speaker holds the turn while thinking) or trails off with no final
mark. Such words keep the turn open for the longer silence (``vad.incomplete_silence_ms``)
even where the model called it complete. Words that end complete sentences as often as
unfinished ones (modals: "Yes, I can."; particles: "Hold on."; "that") are left to the model:
a wrong "unfinished" costs the user a slower turn, not a cut-off, but slows short answers.

Where the LLM can tell (llama.cpp), it judges the same words instead (``judge_words``): the
probability that a sentence-final mark comes next once their own mark is taken away
("What is the capital of France" -> "?" likely; "I would like to go to" -> none). Whisper's
marks are guesses ("How many people live in?"); the LLM reads the words. A high probability
ends the turn after the short silence even where the end-of-turn model heard it unfinished
(Smart Turn calls many plain questions in the joe voice unfinished); a lower one where the
model agrees. BENCHMARKS.md has the sets that chose the bars.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from server.config import VadConfig
from server.pipeline.engines import Rivals

HESITATIONS = ("um", "uh", "er", "erm", "uhm", "hmm")  # fillers: the speaker is thinking
DANGLING = frozenset(
    {
        # articles and possessives
        *("a", "an", "the", "my", "your", "our", "their"),
        # prepositions that end no sentence but a stranded one ("What is it for?" waits longer)
        *("to", "of", "for", "with", "from", "at", "about", "into", "than", "between", "toward"),
        # conjunctions and a subject pronoun
        *("and", "or", "but", "because", "if", "although", "whether", "nor", "i"),
        *HESITATIONS,
    }
)
TRAILING = ("...", "…", ",", "-", "—", ":", ";")  # the recogniser heard the voice trail off
# a filled pause: Whisper writes a speaker's "uh" after words as "uh" or, often, "Uh-huh."
FILLERS = frozenset({*HESITATIONS, "uh-huh", "mm-hmm", "mhm"})
MARKS = " \t\n.?!,;:…"
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


def hesitates(text: str) -> bool:
    """Whether the words end on a filler after other words ("... that serves? Uh-huh."): the
    speaker holds the turn while thinking, whatever the words before it say."""
    head, _, last = text.strip().rstrip(MARKS).rpartition(" ")
    return bool(head.strip()) and last.lower().strip(MARKS) in FILLERS


@dataclass(frozen=True)
class SentenceEnd:
    """The LLM's verdict on the words at a pause: the ``text`` judged and the probability
    (0-1) that it is a whole sentence; None where the LLM could not tell."""

    text: str
    probability: float | None

    def on(self, words: str) -> float | None:
        """The probability, where this verdict was on ``words`` (None: on other words)."""
        return self.probability if self.text == words.strip() else None


PENDING = SentenceEnd("", None)  # the verdict on the pause's words is being asked


@dataclass(frozen=True)
class Bars:
    """The bars for ending a turn on the words at a pause: the LLM's sentence-end probability
    at or above which it ends, ``alone`` whatever the end-of-turn model heard
    (``vad.sentence_end_probability``), ``with_model`` where it called the utterance complete
    (``vad.sentence_end_with_model``); and the recogniser's probability that the last word
    was one that ends no sentence at or above which it does not (``stranded``, 0: never;
    ``vad.stranded_word_probability``)."""

    alone: float = 0.2
    with_model: float = 0.05
    stranded: float = 0.02

    @classmethod
    def of(cls, vad: VadConfig) -> Bars:
        """The bars the configuration sets."""
        return cls(
            vad.sentence_end_probability,
            vad.sentence_end_with_model,
            vad.stranded_word_probability,
        )

    def doubts(self, text: str, rivals: Rivals) -> bool:
        """Whether the recogniser may have heard the words' last one wrong, where the speaker
        said one that ends no sentence (``stranded``)."""
        return self.stranded > 0 and stranded(text, rivals) >= self.stranded


def stranded(text: str, rivals: Rivals) -> float:
    """The recogniser's probability that the last word of ``text`` was one that ends no
    sentence (``DANGLING``), from the ``rivals`` it weighed in its place (seams.Transcript).
    At a pause mid-sentence Whisper often hears such a word as one that finishes the sentence
    ("Do you know who invented the..." as "... invented that?", "and" as "end", "my" as
    "mine") and gives the right one some weight; a clearly heard last word has next to no
    such rival. A rival that begins the written word is the same word cut into tokens (" to"
    of "tomorrow")."""
    words = WORD.findall(text.lower())
    if not words:
        return 0.0
    last = words[-1]
    return sum(p for r, p in rivals if r in DANGLING and r != last and not last.startswith(r))


def judge_words(
    text: str,
    probability: float | None,
    model_complete: bool,
    bars: Bars,
    rivals: Rivals = (),
) -> Words:
    """END or UNFINISHED for the words at a pause, by the LLM's sentence-end ``probability``
    where it has one, else by the words themselves (``sounds_unfinished``, and only where
    the end-of-turn model called the utterance complete); UNFINISHED where they end on a
    filler (``hesitates``) or the recogniser may have heard their last word wrong
    (``Bars.doubts`` on the ``rivals`` it weighed in its place)."""
    if hesitates(text) or bars.doubts(text, rivals):
        return Words.UNFINISHED
    if probability is None:
        return Words.END if model_complete and not sounds_unfinished(text) else Words.UNFINISHED
    if probability >= bars.alone or (model_complete and probability >= bars.with_model):
        return Words.END
    return Words.UNFINISHED


def words_at_pause(
    covered: int,
    text: str,
    pause_start: int,
    quiet_ms: float,
    coming: bool,
    cap_ms: float,
    verdict: SentenceEnd | None = None,
    model_complete: bool = True,
    bars: Bars = Bars(),
    rivals: Rivals = (),
) -> Words:
    """The verdict of the latest partial transcript on a pause that began at ``pause_start``
    (16 kHz samples into the utterance): where it heard all the speech (``covered``
    samples), ``judge_words`` on its ``text`` with the LLM's ``verdict`` on it (``PENDING``:
    wait for it, unless the recogniser doubts the last word: ``rivals``, ``Bars.doubts``);
    else wait while the pause's decode is ``coming`` (the partial loop decodes at a pause).
    Waits last up to ``cap_ms`` of quiet, then the turn goes by the end-of-turn model alone
    (a slow recogniser's decode is the final transcript anyway; partials are shed under
    load)."""
    waits = quiet_ms < cap_ms
    if covered >= pause_start > 0:
        if verdict is PENDING and waits and not bars.doubts(text, rivals):
            return Words.WAIT
        probability = None if verdict is None else verdict.on(text)
        return judge_words(text, probability, model_complete, bars, rivals)
    if coming and waits:
        return Words.WAIT
    return Words.END if model_complete else Words.UNFINISHED
