"""Partial transcripts while the user speaks, and the prefill of what they said so far.

The loop looks as each frame is judged (or every ``PARTIAL_TICK_S``), asks its plan what to
do (server/conversation/partial_plan.py: when to decode, which words are the pause's, what to
warm, when to ask for a verdict or an early reply) and carries that out: the decodes (after the
stable words; a decode after them that hears fewer words than the last partial did is done
again without them), the LLM's verdicts, the warm-ups, the early reply and the events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from server.clock import Clock
from server.conversation.partial_plan import (
    BUSY_PAUSE_MS,
    EARLY_REPLY_QUIET_MS,
    Decode,
    EmitPartial,
    Judge,
    Look,
    PartialAction,
    PartialPlan,
    SetTranscript,
    TryEarly,
    Warm,
)
from server.conversation.partial_words import (
    MIN_PARTIAL_SAMPLES,
    Partial,
    Said,
    ended_early,
    heard_more,
)
from server.conversation.unfinished import SentenceEnd
from server.conversation.utterance import Utterance
from server.metrics import Metrics
from server.pipeline.seams import JudgesWords, ReplyRequest, Transcript, TurnPipeline, engines_busy
from server.pipeline.turn_detector import TurnDetector
from server.runtime.session import Session
from server.runtime.session_view import SessionView
from server.scheduling.engine_queue import JobTag, ShedWork
from server.tasks import cancel
from server.wire.outbound import TranscriptionDelta

log = logging.getLogger(__name__)

PARTIAL_SLACK_SHARE = 0.9  # partials are scheduled as if 90% of the budget were buffered
PARTIAL_TICK_S = 0.02  # the partial loop looks for a pause as audio is judged, or this often
__all__ = ["BUSY_PAUSE_MS", "EARLY_REPLY_QUIET_MS", "PARTIAL_TICK_S", "Partials", "warm_context"]


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
    """The partial transcripts of the current user turn, and what they warmed in the LLM: the
    loop that carries out what its plan (``PartialPlan``) decides."""

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
        self._emit = emit
        self._request = request
        self.plan = PartialPlan(interval_ms, session.session_id[:8])
        self.decode: tuple[int, asyncio.Task[Transcript]] | None = None  # (samples heard, decode)
        self.prefill_cached = 0  # tokens the warm-ups found cached (for the turn's trace)
        self._warming: asyncio.Task[None] | None = None
        self._heard = asyncio.Event()  # more audio judged since the loop last looked

    # --- the plan's state, as others read it (and the ablations, as benchmarks set them) -------
    @property
    def partial(self) -> Partial:
        return self.plan.partial

    @property
    def stable(self) -> str:
        return self.plan.stable

    @property
    def verdict(self) -> SentenceEnd | None:
        """The LLM's on the pause's words."""
        return self.plan.verdict

    @property
    def verdicts(self) -> deque[tuple[float | None, float, float]]:
        """Recent verdicts: (p, ms it took, the recogniser's p of a word ending no sentence)."""
        return self.plan.verdicts

    @property
    def pause_ms(self) -> float:
        """Quiet (ms) after which the words heard are the pause's."""
        return self.plan.pause_ms

    @pause_ms.setter
    def pause_ms(self, value: float) -> None:
        self.plan.pause_ms = value

    @property
    def warm_in_pause(self) -> bool:
        """Ablation: warm words that came back in a pause."""
        return self.plan.warm_in_pause

    @warm_in_pause.setter
    def warm_in_pause(self, value: bool) -> None:
        self.plan.warm_in_pause = value

    @property
    def warm_stable(self) -> bool:
        """Ablation: in speech, warm the stable words only."""
        return self.plan.warm_stable

    @warm_stable.setter
    def warm_stable(self, value: bool) -> None:
        self.plan.warm_stable = value

    @property
    def gaps_are_pauses(self) -> bool:
        """Ablation: take a decode begun in a pause as the pause's where the speech went on."""
        return self.plan.gaps_are_pauses

    @gaps_are_pauses.setter
    def gaps_are_pauses(self, value: bool) -> None:
        self.plan.gaps_are_pauses = value

    def reset(self) -> None:
        """A new user turn: nothing heard yet."""
        self.plan.reset()

    @staticmethod
    def coming(samples: int) -> bool:
        """Whether partial transcripts come for an utterance of ``samples`` (16 kHz)."""
        return samples >= MIN_PARTIAL_SAMPLES

    def heard(self) -> None:
        """More audio was judged: the loop looks again now, not at its next tick."""
        self._heard.set()

    def judged(self) -> float | None:
        """The LLM's sentence-end probability for the latest partial's words (None: none)."""
        verdict = self.plan.verdict
        return None if verdict is None else verdict.on(self.plan.partial.text)

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
        plan = self.plan
        plan.begin(self._clock.now_ms(), ending, early is not None, judges)
        while True:
            await self._look_again()
            actions = plan.look(self._look(), engines_busy(pipeline))
            while actions:
                actions = await self._carry_out(actions, pipeline, early)

    def _look(self) -> Look:
        return Look(self._clock.now_ms(), self._detector.quiet_ms, self._utterance.samples)

    async def _look_again(self) -> None:
        """Until more audio was judged, or PARTIAL_TICK_S at most (not ``asyncio.wait_for``: on
        Python 3.11 it may swallow the cancel that ends the turn if a frame comes with it)."""
        timer = asyncio.get_running_loop().call_later(PARTIAL_TICK_S, self._heard.set)
        try:
            await self._heard.wait()
        finally:
            timer.cancel()
        self._heard.clear()

    async def _carry_out(
        self,
        actions: list[PartialAction],
        pipeline: TurnPipeline,
        early: Callable[[], Awaitable[bool]] | None,
    ) -> list[PartialAction]:
        """Carry out the plan's ``actions`` in order; what it decides on the outcome of the
        last, where that asked for something."""
        for action in actions:
            if isinstance(action, EmitPartial):
                self._emit(TranscriptionDelta(action.text, action.stable).to_dict())
            elif isinstance(action, SetTranscript):
                self._session.set_user_transcript(action.words)
            elif isinstance(action, Warm):
                await self._push(pipeline)
            elif isinstance(action, Decode):
                return await self._decode(pipeline)
            elif isinstance(action, Judge):
                return await self._judge(pipeline, action.words)
            elif isinstance(action, TryEarly):
                assert early is not None
                return self.plan.early_began(await early())
        return []

    async def _decode(self, pipeline: TurnPipeline) -> list[PartialAction]:
        """A partial decode of the utterance as it stands, told to the plan."""
        session = self._session
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
            return []
        return self.plan.decoded(len(audio), heard, got, self._look())

    async def _push(self, pipeline: TurnPipeline) -> None:
        """Have the warm-ups push what the plan says (``said``): one begins, or the one running
        goes on to it."""
        if self._warming is None or self._warming.done():
            if self._warming is not None:
                await self._warming  # done: its outcome was handled in _warm
            warm = self._warm(pipeline, self._session.epoch)
            self._warming = asyncio.get_running_loop().create_task(warm)

    async def _judge(self, pipeline: TurnPipeline, words: str) -> list[PartialAction]:
        """Ask the LLM whether the pause's ``words`` are a whole sentence (the plan holds the
        verdict ``PENDING`` meanwhile)."""
        assert isinstance(pipeline, JudgesWords)
        asked_ms = self._clock.now_ms()
        try:
            probability = await pipeline.sentence_end(self._request(self._session.epoch))
        except BaseException:
            self.plan.judge_failed()
            raise
        took_ms = round(self._clock.now_ms() - asked_ms, 1)
        return self.plan.verdict_came(words, probability, took_ms, self._look())

    async def _warm(self, pipeline: TurnPipeline, epoch: int) -> None:
        """Push the words said so far into the LLM's prefix cache, again while they changed
        during the last warm-up (one warm-up at a time)."""
        warmed = Said()
        while warmed != self.plan.said:
            warmed = self.plan.said
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
