"""Partial transcripts while the user speaks, and the prefill of what they said so far.

The loop re-decodes the growing utterance (16 kHz samples) every interval, or at once when the
speaker pauses (40 ms of quiet, ``PAUSE_MS``; 100 while a reply is being written), after the
words two partials agreed on (the stable words: a decode after them that hears fewer words
than the last partial did is done again without them); it looks as each frame is judged. A
warm-up pushes the words said so far into the LLM's prefix cache, one at a time: the latest
partial's as they grow while the user speaks (their turn left open; the LLM's verdict at a
pause then reads only the words it lacked), and at a pause the whole partial, which heard all
the speech and is usually the final transcript (a decode begun in a pause that returns after
the user spoke on counts as one of speech: its words are not judged). None for the words of a
decode begun in speech that returns in a pause (the pause's decode comes next), nor while the
turn may end on them (the end-of-turn model has yet to judge the pause, or it and the words
say complete): the reply starts right after, and would first wait for it. Where the turn waits
on, an early reply (server/conversation/early.py) may read the pause's words in place of their
warm-up, from 100 ms of quiet (a shorter gap is often one between two words); else they are
warmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from server.clock import Clock
from server.conversation.partial_words import (
    MIN_PARTIAL_SAMPLES,
    Partial,
    Said,
    ended_early,
    heard_more,
    partial_due,
    stable_words,
)
from server.conversation.unfinished import PENDING, SentenceEnd, stranded
from server.conversation.utterance import Utterance
from server.metrics import Metrics
from server.pipeline.seams import JudgesWords, ReplyRequest, Transcript, TurnPipeline, engines_busy
from server.pipeline.turn_detector import PAUSE_MS, TurnDetector
from server.runtime.session import Session
from server.runtime.session_view import SessionView
from server.scheduling.engine_queue import JobTag, ShedWork
from server.tasks import cancel
from server.wire.outbound import TranscriptionDelta

log = logging.getLogger(__name__)

PARTIAL_SLACK_SHARE = 0.9  # partials are scheduled as if 90% of the budget were buffered
PARTIAL_TICK_S = 0.02  # the partial loop looks for a pause as audio is judged, or this often
EARLY_REPLY_QUIET_MS = 100.0  # quiet (ms) before an early reply may begin on a pause's words
# the pause (ms of quiet) while any session's reply is being written: a decode and a verdict at
# every short gap between words would take the cores from the reply being spoken (audio gaps)
BUSY_PAUSE_MS = 100.0


async def warm_context(pipeline: TurnPipeline, request: ReplyRequest, metrics: Metrics) -> None:
    """Push the conversation's context as it stands into the LLM's prefix cache while nobody
    waits for it: a new session's persona before the user first speaks, the history once a
    reply has played out (server/conversation/reply.py). On a slow CPU a long prompt takes the
    LLM seconds to read, and a reader cannot stop halfway, so the next turn's warm-ups and
    reply would wait for it. Optional work: shed while a reply is being written; a failure
    only logs (in the pipeline)."""
    try:
        await pipeline.prefill(request)
    except ShedWork:
        metrics.work_shed.labels("prefill").inc()


class Partials:
    """The partial transcripts of the current user turn, and what they warmed in the LLM."""

    def __init__(
        self,
        session: Session,
        detector: TurnDetector,
        utterance: Utterance,
        metrics: Metrics,
        clock: Clock,
        interval_ms: float,
        emit: Callable[[dict[str, object]], None],
        request: Callable[[int], ReplyRequest],
    ) -> None:
        self._session = session
        self._detector = detector
        self._utterance = utterance
        self._metrics = metrics
        self._clock = clock
        self._interval_ms = interval_ms
        self._emit = emit
        self._request = request
        self.partial = Partial(0, "")
        self.stable = ""
        self._said = Said()  # what the warm-ups push
        self._pause_words = Partial(0, "")  # the partial last taken for a pause's words
        self._pause_said = Said()  # ... as a warm-up would push them
        self._partial_heard = 0  # input samples heard when the latest partial's decode began
        self._early_for = Partial(0, "")  # the partial an early reply was begun on
        self.verdict: SentenceEnd | None = None  # the LLM's on the pause's words
        # recent verdicts: (p, ms it took, the recogniser's p of a word ending no sentence last)
        self.verdicts: deque[tuple[float | None, float, float]] = deque(maxlen=16)
        self.decode: tuple[int, asyncio.Task[Transcript]] | None = None  # (samples heard, decode)
        self.prefill_cached = 0  # tokens the warm-ups found cached (for the turn's trace)
        self._warming: asyncio.Task[None] | None = None
        # ablations: warm words that came back in a pause; in speech, warm the stable words only;
        # take a decode begun in a pause as the pause's even where the speech went on since
        self.warm_in_pause = self.warm_stable = self.gaps_are_pauses = False
        self.pause_ms = PAUSE_MS  # quiet (ms) after which the words heard are the pause's
        self._heard = asyncio.Event()  # more audio judged since the loop last looked

    def reset(self) -> None:
        """A new user turn: nothing heard yet."""
        self.partial = Partial(0, "")
        self.stable = ""
        self._said = Said()
        self._pause_words = Partial(0, "")
        self._pause_said = Said()
        self._early_for = Partial(0, "")
        self.verdict = None

    @staticmethod
    def coming(samples: int) -> bool:
        """Whether partial transcripts come for an utterance of ``samples`` (16 kHz)."""
        return samples >= MIN_PARTIAL_SAMPLES

    def heard(self) -> None:
        """More audio was judged: the loop looks again now, not at its next tick."""
        self._heard.set()

    def judged(self) -> float | None:
        """The LLM's sentence-end probability for the latest partial's words (None: none)."""
        return None if self.verdict is None else self.verdict.on(self.partial.text)

    def take_prefill_cached(self) -> int:
        cached, self.prefill_cached = self.prefill_cached, 0
        return cached

    def view(self) -> SessionView:
        """Partial transcripts are nice to have: they go after work someone is waiting for."""
        view = self._session.view()
        return replace(view, slack_ms=view.budget_ms * PARTIAL_SLACK_SHARE, waiting_since_ms=None)

    async def run(
        self,
        pipeline: TurnPipeline,
        ending: Callable[[], bool],
        early: Callable[[], Awaitable[bool]] | None = None,
        judge: bool = False,
    ) -> None:
        """Decode until cancelled (the turn ended); a warm-up still running then is of no use
        to its reply and is cancelled too. ``ending()``: whether the turn ends as soon as its
        silence is long enough (on the latest partial's words). ``early()``: begin the reply
        to the pause's words now (server/conversation/early.py); whether one runs, which
        reads them in place of a warm-up. ``judge``: ask the LLM whether the words at each
        pause are a whole sentence (``verdict``) before ``ending()`` is asked."""
        judges = judge and isinstance(pipeline, JudgesWords)
        try:
            await self._decode_partials(pipeline, ending, early, judges)
        finally:
            task, self._warming = self._warming, None
            await cancel(task)

    async def _decode_partials(
        self,
        pipeline: TurnPipeline,
        ending: Callable[[], bool],
        early: Callable[[], Awaitable[bool]] | None,
        judges: bool,
    ) -> None:
        session = self._session
        last_ms = self._clock.now_ms()
        while True:
            await self._look_again()
            since = self._clock.now_ms() - last_ms
            quiet, samples = self._detector.quiet_ms, self._utterance.samples
            pause_ms = max(self.pause_ms, BUSY_PAUSE_MS if engines_busy(pipeline) else 0.0)
            pause_start = self._pause_start()  # of the same quiet and samples (no await)
            heard_all = self.partial.covered >= pause_start > 0 and bool(self.partial.text.strip())
            if quiet >= pause_ms and heard_all:  # the pause's words are known
                if self.partial != self._pause_words:
                    await self._pause_on_partial(pipeline, ending, early, judges)
                elif not ending():  # the end-of-turn model may have judged since
                    await self._waits_on(pipeline, early)
                continue
            covered = self.partial.covered
            if not partial_due(since, self._interval_ms, quiet, samples, covered, pause_ms):
                continue
            last_ms = self._clock.now_ms()
            audio = self._utterance.audio()
            heard = session.cursors.heard_until
            tag = JobTag(session.session_id, session.epoch, self.view)
            decode = self._decoded(pipeline, audio, tag, optional=True)
            job = asyncio.get_running_loop().create_task(decode)
            self.decode = (len(audio), job)
            try:
                got = await asyncio.shield(job)  # the endpoint may still want this decode
            except ShedWork:  # required work went first; the next interval tries again
                self.decode = None
                self._metrics.work_shed.labels("partial").inc()
                continue
            previous, text = self.partial, got.text
            self.partial = Partial(len(audio), text, got.last_word_rivals)
            self._partial_heard = heard
            stable = stable_words(previous.text, text)
            self._emit(TranscriptionDelta(text, stable).to_dict())
            if len(stable) > len(self.stable):
                self.stable = stable
            # a decode begun in a pause heard all the speech: likely the final transcript;
            # not where the speech went on before it returned (a gap between two words, long
            # on a slow machine): a verdict on its words would hold this loop, and the decode
            # of the next pause, and they only prefix what the user is saying, as in speech
            same_pause = self.gaps_are_pauses or self._pause_start() <= pause_start
            paused = quiet >= pause_ms and same_pause
            said = text.strip() if paused or not self.warm_stable else self.stable
            now = Said(said, paused, heard)
            if not said or now == self._said or not (paused or len(said) > len(self._said.words)):
                continue
            session.set_user_transcript(said)
            if paused:
                self._pause_words, self._pause_said = self.partial, now
                if judges:
                    await self._judge(pipeline, said)
                ends = ending()
                log.debug(
                    "session %s: the pause's words after %.0f ms of quiet, decoded in %.0f ms: %s",
                    session.session_id[:8],
                    quiet,
                    self._clock.now_ms() - last_ms,
                    "the turn may end on them" if ends else "the turn waits on",
                )
                if not ends:
                    await self._waits_on(pipeline, early)
                continue
            if ending():
                # the reply starts within a tick or two and reads these words in one pass; a
                # warm-up begun now (or one running, going on to them) would still be running
                # then, and the reply would wait for it (a model call cannot stop halfway)
                continue
            quiet_now, samples_now = self._detector.quiet_ms, self._utterance.samples
            if not self.warm_in_pause and partial_due(
                0.0, math.inf, quiet_now, samples_now, len(audio), pause_ms
            ):
                # the user paused after more speech while this decode ran: the pause's decode
                # follows at once, and the end of the turn may wait for it; a warm-up now
                # would share the cores with it, for words the reply or the pause's warm-up
                # reads anyway
                continue
            await self._push(pipeline, now)

    def _pause_start(self) -> int:
        """Where (16 kHz samples into the utterance) the current quiet began: the end of the
        audio while the user speaks."""
        return self._utterance.samples - int(self._detector.quiet_ms * 16)

    async def _look_again(self) -> None:
        """Until more audio was judged, or PARTIAL_TICK_S at most (not ``asyncio.wait_for``: on
        Python 3.11 it may swallow the cancel that ends the turn if a frame comes with it)."""
        timer = asyncio.get_running_loop().call_later(PARTIAL_TICK_S, self._heard.set)
        try:
            await self._heard.wait()
        finally:
            timer.cancel()
        self._heard.clear()

    async def _pause_on_partial(
        self,
        pipeline: TurnPipeline,
        ending: Callable[[], bool],
        early: Callable[[], Awaitable[bool]] | None,
        judges: bool,
    ) -> None:
        """The last partial, begun before the pause was PAUSE_MS long, heard all the speech:
        its words are the pause's, and no decode of the pause follows."""
        words = self.partial.text.strip()
        self._pause_words, self._pause_said = self.partial, Said(words, True, self._partial_heard)
        self._session.set_user_transcript(words)
        if judges:
            await self._judge(pipeline, words)
        if not ending():
            await self._waits_on(pipeline, early)

    async def _waits_on(
        self, pipeline: TurnPipeline, early: Callable[[], Awaitable[bool]] | None
    ) -> None:
        """The turn waits on after the pause's words (the end-of-turn model heard them as
        unfinished, or they stop mid-sentence): an early reply begins on them (``early()``,
        from EARLY_REPLY_QUIET_MS of quiet: a gap mid-sentence would begin and drop one
        again and again), which reads them in place of a warm-up; else they are warmed."""
        if self._early_for == self.partial:
            return  # an early reply reads them
        if early is not None and self._detector.quiet_ms < EARLY_REPLY_QUIET_MS:
            return  # one may begin on them soon
        if early is not None and await early():
            self._early_for = self.partial
            sid = self._session.session_id[:8]
            log.debug("session %s: an early reply reads the pause's words", sid)
            return
        if self._pause_said != self._said:
            await self._push(pipeline, self._pause_said)

    async def _push(self, pipeline: TurnPipeline, said: Said) -> None:
        """Have the warm-ups push ``said``: one begins, or the one running goes on to it."""
        self._said = said
        if self._warming is None or self._warming.done():
            if self._warming is not None:
                await self._warming  # done: its outcome was handled in _warm
            warm = self._warm(pipeline, self._session.epoch)
            self._warming = asyncio.get_running_loop().create_task(warm)

    async def _judge(self, pipeline: TurnPipeline, words: str) -> None:
        """Ask the LLM whether the pause's ``words`` (the user's transcript now) are a whole
        sentence; the end of the turn waits for it (``PENDING``) a bounded time."""
        if not words or (self.verdict is not None and self.verdict.text == words):
            return
        assert isinstance(pipeline, JudgesWords)
        self.verdict, asked_ms = PENDING, self._clock.now_ms()
        try:
            probability = await pipeline.sentence_end(self._request(self._session.epoch))
        finally:
            self.verdict = None
        self.verdict = SentenceEnd(words, probability)
        took_ms = round(self._clock.now_ms() - asked_ms, 1)
        self.verdicts.append((probability, took_ms, stranded(words, self.partial.last_word_rivals)))
        log.debug(
            "session %s: the pause's words are a sentence with p %s",
            self._session.session_id[:8],
            probability,
        )

    async def _warm(self, pipeline: TurnPipeline, epoch: int) -> None:
        """Push the words said so far into the LLM's prefix cache, again while they changed
        during the last warm-up (one warm-up at a time)."""
        warmed = Said()
        while warmed != self._said:
            warmed = self._said
            try:
                cached = await pipeline.prefill(self._request(epoch), paused=warmed.paused)
            except ShedWork:  # a reply is being written: the warm-up would slow it
                self._metrics.work_shed.labels("prefill").inc()
                return
            self.prefill_cached = max(self.prefill_cached, cached)
            # heard_until only grows: what was heard when the decode began is still heard
            cursors = self._session.cursors
            self._session.input.advance_prefilled(max(cursors.prefilled_until, warmed.heard))

    async def final(
        self,
        pipeline: TurnPipeline,
        utterance: npt.NDArray[np.int16],
        speech_end: int,
        tag: JobTag,
        incremental: bool,
    ) -> str:
        """The last partial when it already heard all the speech (``speech_end``: 16 kHz
        samples), or the partial decode still running if it will have; else decode the
        utterance now, after its stable words."""
        decode, self.decode = self.decode, None
        if incremental and speech_end > 0:
            if self.partial.covered >= speech_end:
                return self.partial.text
            if decode is not None and decode[0] >= speech_end:
                with contextlib.suppress(Exception):
                    return (await decode[1]).text
        return (await self._decoded(pipeline, utterance, tag, optional=False)).text

    async def _decoded(
        self, pipeline: TurnPipeline, audio: npt.NDArray[np.int16], tag: JobTag, optional: bool
    ) -> Transcript:
        """``audio`` decoded after the stable words (``optional``: a partial, which may be
        shed); again without them where that ``ended_early``, kept if it ``heard_more``."""
        prefix, before = self.stable, self.partial.text

        async def decode(after: str) -> Transcript:
            if optional:
                return await pipeline.partial_transcript(audio, tag, prefix=after)
            return Transcript(await pipeline.transcribe(audio, tag, prefix=after))

        got = await decode(prefix)
        if not ended_early(prefix, got.text, before):
            return got
        again = await decode("")
        log.debug(
            "session %s: %d words after the stable ones (%d before), %d without them",
            tag.session_id[:8],
            len(got.text.split()),
            len(before.split()),
            len(again.text.split()),
        )
        return again if heard_more(again.text, got.text) else got

    def abandon_decode(self) -> asyncio.Task[Transcript] | None:
        """The decode in flight, handed over to be cancelled (the conversation closes)."""
        decode, self.decode = self.decode, None
        return None if decode is None else decode[1]
