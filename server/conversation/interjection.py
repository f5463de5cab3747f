"""Pause first, decide second: is voice heard over a reply an interruption?

When the gate hears voice over a reply, the reply pauses at once (server/conversation/floor.py).
The :class:`InterjectionJudge` then watches the turn detector, frame by frame, and decides:

- the gate's voice lapses before the confirming model calls it speech (a click, a knock, a
  tone): **resume**, "no voice". Where the residual echo gate (server/pipeline/echo_gate.py)
  hid frames from the detector meanwhile (the user talked over the reply's echo, which still
  comes back for a while after the pause), the quiet counts from the last hidden frame, and
  the lapse asks for the words instead: the recogniser hears the cancelled audio, hidden
  frames included ("stop" said over a loud echo is no click). Confirmed speech is not quiet
  while frames are hidden either (what the detector missed may be the rest of the words);
- confirmed speech falls quiet for ``quiet_ms``: its words are transcribed. No words (a cough)
  or only backchannels ("mm-hm", "yeah", "ok", "right", "I see"): **resume**; anything else
  ("wait", "stop", "no"): **interrupt**. Speech that goes on while its words are transcribed
  is judged again (the older transcript no longer counts);
- confirmed speech that goes on for ``interruption_ms`` from its onset: its words so far are
  transcribed; any that is not a backchannel **interrupts** at once, else it is judged when it
  falls quiet ("oh, okay, I see" is a long backchannel);
- the paused turn's deadline (``runtime.paused_timeout_ms``): interrupt if speech was
  confirmed, else resume;
- words that are the reply's own (:func:`own_words`: the avatar's voice come back through a
  client's speakers, past the echo handling) **resume** it, "its own words": the server knows
  what the user heard of it.

The judge is synchronous and does no I/O; positions are ms on the input timeline.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from server.config import VadConfig
from server.runtime.history import Role
from server.runtime.response import heard_prefix
from server.runtime.session import Session

log = logging.getLogger(__name__)

LAPSE_MS = 200.0  # the gate quiet this long with no confirmed speech: no voice after all
MAX_BACKCHANNEL_WORDS = 6  # hums and fillers aside: "Mm-hm. Mm-hm. Mm-hm." is no word
# what the recogniser reads as said before an interjection (Whisper's previous-text prompt):
# primed so, it spells a short "mm-hm" as one instead of inventing words ("And then they
# can..."), while "Stop." and longer requests come out as before (benchmarks/interjection_bench).
# Both spellings of the hum: with "Mhm." too, 225 of 240 backchannels resumed against 219, and
# 339 of 360 interruptions stopped either way (benchmarks/interjection_words.py)
INTERJECTION_CONTEXT = "Mm-hm. Mhm. Uh-huh. Yeah. Okay. Stop."
PREROLL_MS = 100.0  # of audio before the onset given to the recogniser with an interjection
FILLERS = frozenset(
    {"mm", "mmm", "mhm", "hm", "hmm", "uh", "huh", "um", "umm", "ah", "oh", "aha", "ooh", "wow"}
)
BACKCHANNELS = frozenset(
    tuple(phrase.split())
    for phrase in (
        "yeah", "yes", "yep", "yup", "ok", "okay", "right", "sure", "alright", "all right",
        "i see", "got it", "cool", "nice", "great", "true", "exactly", "indeed", "thank you",
        "thanks", "good", "uh huh", "mm hm", "i know", "of course", "totally", "definitely",
        "absolutely", "interesting", "you",  # "you": Whisper's word for a noise
    )
)  # fmt: skip
SAID_WORDS = 16  # the reply's last words heard (4-6 s of speech) that its echo can repeat
OWN_SHARE = 0.75  # of three or more words heard, this share among them: the reply's own
FLOOR_WORDS = frozenset({"stop", "wait", "no", "hold", "hang", "sorry", "excuse", "hey", "pause"})
# noise tags and Whisper's inventions for sounds: "(coughs)", "[MUSIC]", "*sigh*", "== Intro =="
_NOT_WORDS = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*|=+[^=]*=+")
# a hum or a grunt however it is spelt: "mmm", "mhm", "hmmm", "mm-hmm", "uhhh", "ahh", "ohh", "emm"
_HUM = re.compile(r"^([mh]+|u+h+|u+m+|a+h+|o+h+|e+h+|e+m+|e+r+m*)$")


def words_of(text: str) -> list[str]:
    """The words of a transcript, lower case, without punctuation or noise tags; a drawn-out
    sound spelt with hyphens ("A-mm-m-m-m", "Emm-m-hm") is one hum."""
    plain = _NOT_WORDS.sub(" ", text.lower())
    words: list[str] = []
    for token in re.sub(r"[^a-z'\- ]", " ", plain).replace("'", "").split():
        parts = [part for part in token.split("-") if part]
        words.extend(["mm"] if len(parts) > 1 and _drawn_out(parts) else parts)
    return words


def _drawn_out(parts: list[str]) -> bool:
    """The parts of a hyphenated token are one sound: hums and single letters, at least half
    of them hums ("a-mm-m-m"; not "x-ray", "i-t")."""
    hums = sum(_is_hum(part) for part in parts)
    return all(_is_hum(part) or len(part) == 1 for part in parts) and 2 * hums >= len(parts)


def _is_hum(word: str) -> bool:
    """A filler or a hum ("uh", "mhm", "hmmm"), not a word."""
    return word in FILLERS or _HUM.match(word) is not None


def is_backchannel(text: str) -> bool:
    """True when ``text`` holds no words, or only fillers and backchannel phrases (at most
    ``MAX_BACKCHANNEL_WORDS`` words besides hums and fillers, which the recogniser may
    repeat): a listener's signal, not a bid for the floor."""
    words = words_of(text)
    if sum(not _is_hum(w) for w in words) > MAX_BACKCHANNEL_WORDS:
        return False
    i = 0
    while i < len(words):
        if _is_hum(words[i]):
            i += 1
        elif tuple(words[i : i + 2]) in BACKCHANNELS:
            i += 2
        elif (words[i],) in BACKCHANNELS:
            i += 1
        else:
            return False
    return True


def own_words(text: str, said: Sequence[str]) -> bool:
    """Whether the words of ``text`` (hums and fillers aside) are the reply's own: among
    ``said``, the words the user last heard of it (:func:`reply_words`), all of them, or at
    least ``OWN_SHARE`` of three or more (the recogniser mishears a word of the echo), and
    none of them a word that bids for the floor (``FLOOR_WORDS``: "No." over a reply that
    said "no" is the user)."""
    heard = [w for w in words_of(text) if not _is_hum(w) and w not in FILLERS]
    if not heard or any(w in FLOOR_WORDS for w in heard):
        return False
    reply = set(said)
    own = sum(w in reply for w in heard)
    return own == len(heard) or (len(heard) >= 3 and own >= OWN_SHARE * len(heard))


def reply_words(session: Session, last: int = SAID_WORDS) -> tuple[str, ...]:
    """The ``last`` words the user heard of the reply in progress (its turn in the history,
    and what played of its chunks not yet committed there)."""
    turns = session.history.turns
    told = [t.text for t in turns if t.role is Role.ASSISTANT and t.epoch == session.epoch]
    playing = [heard_prefix(chunk, chunk.played) for chunk in session.pending_chunks()]
    return tuple(words_of(" ".join(told + playing))[-last:])


class Phase(IntEnum):
    """Where the judgement of the voice over a paused reply stands."""

    IDLE = 0  # nothing paused
    HEARD = 1  # the gate heard voice; the confirming model has not called it speech
    SPEECH = 2  # speech confirmed: it may grow long, or fall quiet
    WORDS = 3  # the speech fell quiet: its words are being transcribed


class Verdict(Enum):
    RESUME = "resume"
    INTERRUPT = "interrupt"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class AskWords:
    """Transcribe the input from ``from_ms`` (the onset) on; answer with ``attempt``
    (``final``: the speech fell quiet; else it is still going on)."""

    attempt: int
    from_ms: float
    final: bool = True


@dataclass(frozen=True)
class Listening:
    """What the judge reads of the turn detector after a frame (ms on the input timeline):
    its position, whether it is in speech, and how long the speaker (``quiet_ms``) and the
    gate (``gate_quiet_ms``) have been quiet, since the echo gate hid a frame, and whether
    the gate's latest voiced run was a tone."""

    position_ms: float
    speech: bool
    quiet_ms: float
    gate_quiet_ms: float
    masked_ms: float = float("inf")  # since the echo gate last hid a frame from the detector
    tonal: bool = False  # the gate's latest voiced run was a tone (a beep; TurnDetector.gate_tonal)


@dataclass(frozen=True)
class JudgeRules:
    interruption_ms: float
    quiet_ms: float
    lapse_ms: float = LAPSE_MS

    @classmethod
    def of(cls, vad: VadConfig) -> JudgeRules:
        return cls(float(vad.interruption_ms), float(vad.interjection_quiet_ms))


class InterjectionJudge:
    """Decides one pause at a time; :meth:`_to` is the one place its phase changes."""

    def __init__(self, rules: JudgeRules, session_id: str = "") -> None:
        self.rules = rules
        self._sid = session_id[:8]
        self.phase = Phase.IDLE
        self.onset_ms = 0.0  # where the voice began (input timeline)
        self.attempt = 0  # of the words asked for; an older transcript is ignored
        self._probed = False  # the words of long speech were asked for
        self._confirmed = False  # the confirming model called the voice speech

    @property
    def confirmed(self) -> bool:
        """Whether the confirming model called the voice of the last pause speech."""
        return self._confirmed

    def heard(self, onset_ms: float) -> None:
        """The reply paused for voice that began at ``onset_ms``."""
        self.onset_ms = onset_ms
        self._probed = self._confirmed = False
        self._to(Phase.HEARD, "voice over the reply")

    def step(self, now: Listening) -> Decision | AskWords | None:
        """After a frame: a decision, a request for the words, or nothing yet."""
        if self.phase is Phase.IDLE:
            return None
        if self.phase is Phase.HEARD:
            if not now.speech:
                if min(now.gate_quiet_ms, now.masked_ms) < self.rules.lapse_ms:
                    return None
                if now.masked_ms >= now.gate_quiet_ms:
                    return self._decide(Verdict.RESUME, "no voice")
                if now.tonal:  # a beep the echo gate partly hid: no words to ask for
                    return self._decide(Verdict.RESUME, "a tone")
                self.attempt += 1
                self._to(Phase.WORDS, "the voice lapsed under the echo")
                return AskWords(self.attempt, self.onset_ms)
            self._confirmed = True
            self._to(Phase.SPEECH, "speech confirmed")
        speaking = now.speech and now.quiet_ms == 0.0
        if self.phase is Phase.WORDS:
            if not speaking:
                return None
            self._to(Phase.SPEECH, "speech goes on")  # the words asked for no longer count
        quiet = now.quiet_ms if now.speech else float("inf")
        if min(quiet, now.masked_ms) >= self.rules.quiet_ms:
            self.attempt += 1
            self._to(Phase.WORDS, "the speech fell quiet")
            return AskWords(self.attempt, self.onset_ms)
        voiced_ms = now.position_ms - now.quiet_ms - self.onset_ms
        if not self._probed and voiced_ms >= self.rules.interruption_ms:
            self._probed = True
            self.attempt += 1
            return AskWords(self.attempt, self.onset_ms, final=False)
        return None

    def words(self, attempt: int, text: str, said: Sequence[str] = ()) -> Decision | None:
        """The transcript of ``attempt``: a decision, or None (it came too late, or the speech
        still going on said only backchannels, or the reply's own words, so far). ``said``:
        the words the user last heard of the reply (see :func:`own_words`)."""
        if attempt != self.attempt or self.phase < Phase.SPEECH:
            return None
        if own_words(text, said):
            if self.phase is Phase.WORDS:
                return self._decide(Verdict.RESUME, "its own words")
            return None
        if not is_backchannel(text):
            return self._decide(Verdict.INTERRUPT, "words")
        if self.phase is Phase.WORDS:
            return self._decide(Verdict.RESUME, "backchannel" if words_of(text) else "no words")
        return None

    def overdue(self) -> Decision:
        """The pause reached its deadline: speech confirmed is an interruption, else resume."""
        if self._confirmed:
            return self._decide(Verdict.INTERRUPT, "undecided speech")
        return self._decide(Verdict.RESUME, "undecided")

    def abandon(self) -> None:
        """The pause ended some other way (typed text, cancel, the reply played out)."""
        if self.phase is not Phase.IDLE:
            self._to(Phase.IDLE, "pause ended elsewhere")

    def _decide(self, verdict: Verdict, reason: str) -> Decision:
        self._to(Phase.IDLE, f"{verdict.value}: {reason}")
        return Decision(verdict, reason)

    def _to(self, new: Phase, reason: str) -> None:
        old, self.phase = self.phase, new
        log.debug("session %s interjection: %s -> %s (%s)", self._sid, old.name, new.name, reason)


@dataclass
class HeardWords:
    """The latest interjections' transcripts, and how long each took to hear (ms: the words
    asked for -> their transcript), newest last; for diagnostics."""

    session_id: str = ""
    words: deque[str] = field(default_factory=lambda: deque(maxlen=8))
    took_ms: deque[float] = field(default_factory=lambda: deque(maxlen=8))

    def add(self, text: str, took_ms: float) -> None:
        self.words.append(text)
        self.took_ms.append(took_ms)
        log.info("session %s: an interjection heard in %.0f ms", self.session_id[:8], took_ms)

    def view(self) -> dict[str, object]:
        return {"words": list(self.words), "hearing_ms": [round(ms) for ms in self.took_ms]}
