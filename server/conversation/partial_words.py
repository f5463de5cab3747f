"""The partial loop's rules and values: when it decodes (``partial_due``), which words two
partials agreed on (``stable_words``), a partial transcript and the words a warm-up pushes.
Pure: no clock, no engine (server/conversation/partials.py runs the loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.pipeline.engines import Rivals
from server.pipeline.repetition import normalise_word
from server.pipeline.turn_detector import PAUSE_MS

MIN_PARTIAL_SAMPLES = 4800  # 300 ms at 16 kHz: shorter utterances get no partial


@dataclass(frozen=True)
class Partial:
    """A partial transcript, the samples (16 kHz) it heard, its last word's rivals (Transcript)."""

    covered: int
    text: str
    last_word_rivals: Rivals = ()


@dataclass(frozen=True)
class Said:
    """The user's words a warm-up pushes: a partial's in speech, or a pause's (``paused``: the
    user paused after them, so they may be all the turn says). ``heard``: input samples heard
    when the decode that found them began (not part of what was said)."""

    words: str = ""
    paused: bool = False
    heard: int = field(default=0, compare=False)


def partial_due(
    since_last_ms: float,
    interval_ms: float,
    quiet_ms: float,
    samples: int,
    covered: int,
    pause_ms: float = PAUSE_MS,
) -> bool:
    """Whether the partial loop decodes now: an interval after the last partial began, or at
    once when the speaker paused (quiet for ``pause_ms``) after audio the last partial did not
    hear, so that the decode hearing all the speech runs during the end-of-turn wait and is
    the final transcript at the endpoint. Never when all the audio the last partial did not
    hear is silence (the end-of-turn wait): that decode would find nothing new and hold the
    recogniser while the reply starts. ``samples``/``covered``: 16 kHz samples of the
    utterance and of the last partial's audio."""
    if samples <= covered or samples < MIN_PARTIAL_SAMPLES:
        return False
    pause_start = samples - int(quiet_ms * 16)
    if covered >= pause_start:
        return False
    return since_last_ms >= interval_ms or quiet_ms >= pause_ms


def stable_words(previous: str, current: str) -> str:
    """Local agreement of two consecutive partial transcripts: their longest common prefix of
    words (case and punctuation aside), as the words of ``current``."""
    agreed: list[str] = []
    for before, now in zip(previous.split(), current.split(), strict=False):
        if normalise_word(before) != normalise_word(now):
            break
        agreed.append(now)
    return " ".join(agreed)


def ended_early(prefix: str, heard: str, before: str) -> bool:
    """Whether a decode after ``prefix`` (the stable words) heard fewer words than the last
    partial (``before``) did on less audio: the decoder may have ended right after the words
    it was given (Moonshine wrote "What is the difference between a frog?" for "... between a
    frog and a toad?"). Such audio is decoded again without them (see ``heard_more``)."""
    return bool(prefix.strip()) and len(heard.split()) < len(before.split())


def heard_more(again: str, heard: str) -> bool:
    """Whether the decode without the stable words (``again``) heard more words than the one
    after them (``heard``): it is kept then, else the first."""
    return len(again.split()) > len(heard.split())
