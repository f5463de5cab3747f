"""What the partial loop does next, decided from what it is told (server/conversation/partials.py
carries it out).

The loop re-decodes the growing utterance (16 kHz samples) every interval, or at once when the
speaker pauses (40 ms of quiet, ``PAUSE_MS``; 100 while a reply is being written), after the
words two partials agreed on (the stable words). A warm-up pushes the words said so far into
the LLM's prefix cache, one at a time: the latest partial's as they grow while the user speaks
(their turn left open; the LLM's verdict at a pause then reads only the words it lacked), and
at a pause the whole partial, which heard all the speech and is usually the final transcript (a
decode begun in a pause that returns after the user spoke on counts as one of speech: its words
are not judged). None for the words of a decode begun in speech that returns in a pause (the
pause's decode comes next), nor while the turn may end on them (the end-of-turn model has yet
to judge the pause, or it and the words say complete): the reply starts right after, and would
first wait for it. Where the turn waits on, an early reply (server/conversation/early.py) may
read the pause's words in place of their warm-up, from 100 ms of quiet (a shorter gap is often
one between two words); else they are warmed.

``PartialPlan`` decides: it takes a look (clock ms, the detector's quiet ms, the utterance's
samples), a decode's transcript, the LLM's verdict, whether an early reply began, and returns
the actions to carry out in order; the last may ask for something (``Decode``, ``Judge``,
``TryEarly``) whose outcome is told back. It awaits nothing and calls no engine, so it is
tested without asyncio (tests/server/conversation/test_partial_plan.py).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from server.conversation.partial_words import Partial, Said, partial_due, stable_words
from server.conversation.unfinished import PENDING, SentenceEnd, stranded
from server.pipeline.seams import Transcript
from server.pipeline.turn_detector import PAUSE_MS

log = logging.getLogger(__name__)

EARLY_REPLY_QUIET_MS = 100.0  # quiet (ms) before an early reply may begin on a pause's words
# the pause (ms of quiet) while any session's reply is being written: a decode and a verdict at
# every short gap between words would take the cores from the reply being spoken (audio gaps)
BUSY_PAUSE_MS = 100.0


@dataclass(frozen=True)
class Look:
    """What the loop sees now: the clock (ms), the detector's quiet (ms), the utterance's
    samples (16 kHz)."""

    now_ms: float
    quiet_ms: float
    samples: int

    @property
    def pause_start(self) -> int:
        """Where (16 kHz samples into the utterance) the current quiet began: the end of the
        audio while the user speaks."""
        return self.samples - int(self.quiet_ms * 16)


@dataclass(frozen=True)
class Decode:
    """Decode the utterance as it stands (a partial, which may be shed); tell ``decoded``."""


@dataclass(frozen=True)
class EmitPartial:
    """Send the client the partial transcript ``text`` and its ``stable`` words."""

    text: str
    stable: str


@dataclass(frozen=True)
class SetTranscript:
    """The user's transcript so far is ``words``."""

    words: str


@dataclass(frozen=True)
class Judge:
    """Ask the LLM whether the pause's ``words`` are a whole sentence; tell ``verdict_came``
    (or ``judge_failed``)."""

    words: str


@dataclass(frozen=True)
class TryEarly:
    """Begin the reply to the pause's words now (server/conversation/early.py); tell
    ``early_began``."""


@dataclass(frozen=True)
class Warm:
    """Have the warm-ups push ``said`` (``PartialPlan.said``): one begins, or the one running
    goes on to it."""

    said: Said


PartialAction = Decode | EmitPartial | SetTranscript | Judge | TryEarly | Warm
Actions = list[PartialAction]


@dataclass(frozen=True)
class _Asked:
    """The look a decode was asked at, and the pause (ms of quiet) then."""

    look: Look
    pause_ms: float


def _never() -> bool:
    return False


class PartialPlan:
    """The partial transcripts of the current user turn, what the warm-ups push, and the LLM's
    verdict on the pause's words; what the loop does next."""

    def __init__(self, interval_ms: float, sid: str = "") -> None:
        """``interval_ms``: between two partial decodes in speech; ``sid``: for the log."""
        self._interval_ms = interval_ms
        self._sid = sid
        self.partial = Partial(0, "")
        self.stable = ""
        self.said = Said()  # what the warm-ups push
        self._pause_words = Partial(0, "")  # the partial last taken for a pause's words
        self._pause_said = Said()  # ... as a warm-up would push them
        self._partial_heard = 0  # input samples heard when the latest partial's decode began
        self._early_for = Partial(0, "")  # the partial an early reply was begun on
        self.verdict: SentenceEnd | None = None  # the LLM's on the pause's words
        # recent verdicts: (p, ms it took, the recogniser's p of a word ending no sentence last)
        self.verdicts: deque[tuple[float | None, float, float]] = deque(maxlen=16)
        # ablations: warm words that came back in a pause; in speech, warm the stable words only;
        # take a decode begun in a pause as the pause's even where the speech went on since
        self.warm_in_pause = self.warm_stable = self.gaps_are_pauses = False
        self.pause_ms = PAUSE_MS  # quiet (ms) after which the words heard are the pause's
        # the loop's run (``begin``)
        self._ending: Callable[[], bool] = _never
        self._early = False
        self._judges = False
        self._last_ms = 0.0  # when the latest decode was asked for (clock ms)
        self._asked: _Asked | None = None
        self._log_from: tuple[float, float] | None = None  # a decode's pause: quiet, asked ms

    def reset(self) -> None:
        """A new user turn: nothing heard yet."""
        self.partial = Partial(0, "")
        self.stable = ""
        self.said = Said()
        self._pause_words = Partial(0, "")
        self._pause_said = Said()
        self._early_for = Partial(0, "")
        self.verdict = None

    def begin(self, now_ms: float, ending: Callable[[], bool], early: bool, judges: bool) -> None:
        """The loop starts at ``now_ms``. ``ending()``: whether the turn ends as soon as its
        silence is long enough (on the latest partial's words); ``early``: an early reply may
        be tried; ``judges``: the LLM judges the words at each pause before ``ending()``."""
        self._last_ms = now_ms
        self._ending, self._early, self._judges = ending, early, judges

    def look(self, at: Look, busy: bool) -> Actions:
        """The loop looks again (``busy``: some session's reply is being written)."""
        pause_ms = max(self.pause_ms, BUSY_PAUSE_MS if busy else 0.0)
        pause_start = at.pause_start
        partial = self.partial
        heard_all = partial.covered >= pause_start > 0 and bool(partial.text.strip())
        if at.quiet_ms >= pause_ms and heard_all:  # the pause's words are known
            if partial != self._pause_words:
                return self._pause_on_partial(at)
            if not self._ending():  # the end-of-turn model may have judged since
                return self._waits_on(at)
            return []
        since, covered = at.now_ms - self._last_ms, partial.covered
        if not partial_due(since, self._interval_ms, at.quiet_ms, at.samples, covered, pause_ms):
            return []
        self._last_ms = at.now_ms
        self._asked = _Asked(at, pause_ms)
        return [Decode()]

    def _pause_on_partial(self, at: Look) -> Actions:
        """The last partial, begun before the pause was PAUSE_MS long, heard all the speech:
        its words are the pause's, and no decode of the pause follows."""
        words = self.partial.text.strip()
        self._pause_words, self._pause_said = self.partial, Said(words, True, self._partial_heard)
        self._log_from = None
        return [SetTranscript(words), *self._judge_then(words, at)]

    def decoded(self, samples: int, heard: int, got: Transcript, at: Look) -> Actions:
        """The decode asked for returned ``got`` (of ``samples``, 16 kHz; ``heard``: input
        samples heard when it began); ``at``: the look now."""
        asked, self._asked = self._asked, None
        assert asked is not None, "decoded without a Decode"
        quiet, pause_ms = asked.look.quiet_ms, asked.pause_ms
        previous, text = self.partial, got.text
        self.partial = Partial(samples, text, got.last_word_rivals)
        self._partial_heard = heard
        stable = stable_words(previous.text, text)
        actions: Actions = [EmitPartial(text, stable)]
        if len(stable) > len(self.stable):
            self.stable = stable
        # a decode begun in a pause heard all the speech: likely the final transcript;
        # not where the speech went on before it returned (a gap between two words, long
        # on a slow machine): a verdict on its words would hold this loop, and the decode
        # of the next pause, and they only prefix what the user is saying, as in speech
        same_pause = self.gaps_are_pauses or at.pause_start <= asked.look.pause_start
        paused = quiet >= pause_ms and same_pause
        said = text.strip() if paused or not self.warm_stable else self.stable
        now = Said(said, paused, heard)
        if not said or now == self.said or not (paused or len(said) > len(self.said.words)):
            return actions
        actions.append(SetTranscript(said))
        if paused:
            self._pause_words, self._pause_said = self.partial, now
            self._log_from = (quiet, self._last_ms)
            return actions + self._judge_then(said, at)
        if self._ending():
            # the reply starts within a tick or two and reads these words in one pass; a
            # warm-up begun now (or one running, going on to them) would still be running
            # then, and the reply would wait for it (a model call cannot stop halfway)
            return actions
        if not self.warm_in_pause and partial_due(
            0.0, math.inf, at.quiet_ms, at.samples, samples, pause_ms
        ):
            # the user paused after more speech while this decode ran: the pause's decode
            # follows at once, and the end of the turn may wait for it; a warm-up now
            # would share the cores with it, for words the reply or the pause's warm-up
            # reads anyway
            return actions
        return actions + self._warm(now)

    def _judge_then(self, words: str, at: Look) -> Actions:
        """The LLM judges the pause's ``words`` (the user's transcript now) where it does and
        has not yet; the end of the turn waits for it (``PENDING``) a bounded time. Then what
        the turn waiting on or not asks."""
        if self._judges and words and not (self.verdict is not None and self.verdict.text == words):
            self.verdict = PENDING
            return [Judge(words)]
        return self._after_verdict(at)

    def judge_failed(self) -> None:
        """The verdict asked for never came (the call failed or was cancelled)."""
        self.verdict = None

    def verdict_came(
        self, words: str, probability: float | None, took_ms: float, at: Look
    ) -> Actions:
        """The LLM's sentence-end ``probability`` for ``words`` came ``took_ms`` after it was
        asked for; ``at``: the look now."""
        self.verdict = SentenceEnd(words, probability)
        self.verdicts.append((probability, took_ms, stranded(words, self.partial.last_word_rivals)))
        log.debug("session %s: the pause's words are a sentence with p %s", self._sid, probability)
        return self._after_verdict(at)

    def _after_verdict(self, at: Look) -> Actions:
        ends = self._ending()
        if self._log_from is not None:
            quiet, asked_ms = self._log_from
            self._log_from = None
            log.debug(
                "session %s: the pause's words after %.0f ms of quiet, decoded in %.0f ms: %s",
                self._sid,
                quiet,
                at.now_ms - asked_ms,
                "the turn may end on them" if ends else "the turn waits on",
            )
        return [] if ends else self._waits_on(at)

    def _waits_on(self, at: Look) -> Actions:
        """The turn waits on after the pause's words (the end-of-turn model heard them as
        unfinished, or they stop mid-sentence): an early reply begins on them (``TryEarly``,
        from EARLY_REPLY_QUIET_MS of quiet: a gap mid-sentence would begin and drop one
        again and again), which reads them in place of a warm-up; else they are warmed."""
        if self._early_for == self.partial:
            return []  # an early reply reads them
        if self._early and at.quiet_ms < EARLY_REPLY_QUIET_MS:
            return []  # one may begin on them soon
        if self._early:
            return [TryEarly()]
        return self._warm_pause()

    def early_began(self, began: bool) -> Actions:
        """Whether the early reply asked for began (it reads the pause's words)."""
        if began:
            self._early_for = self.partial
            log.debug("session %s: an early reply reads the pause's words", self._sid)
            return []
        return self._warm_pause()

    def _warm_pause(self) -> Actions:
        return self._warm(self._pause_said) if self._pause_said != self.said else []

    def _warm(self, said: Said) -> Actions:
        self.said = said
        return [Warm(said)]
