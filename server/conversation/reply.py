"""The reply of one turn: the final transcript, the LLM's sentences, their speech queued for
playback within the lookahead budget, and the stage timings of what was heard.

``Replies`` makes the engine calls (the final transcript, the LLM's stream, the speech, the
early reply's preparation, each within a stage's time) and carries out what the reply's plan
(server/conversation/reply_plan.py) decides from their outcomes, in one loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from server.avatar.lipsync import LipSync
from server.clock import Clock
from server.config import Config
from server.conversation.early import EarlyReply
from server.conversation.partials import Partials, warm_context
from server.conversation.reply_plan import (
    Actions,
    AdoptEarly,
    AwaitEarly,
    CloseEarly,
    CommitTurn,
    Compose,
    DeliverText,
    EmitDelta,
    EmitTranscript,
    Finish,
    Flush,
    FollowUp,
    MakeCall,
    NextSentence,
    OpenChunk,
    OpenStream,
    ReplyAction,
    ReplyPlan,
    ServerError,
    Speak,
    StartResponse,
    Transcribe,
    TryAdopt,
    WaitForRoom,
    WarmWhenPlayed,
    reported,
)
from server.conversation.voicing import Voicing
from server.metrics import Metrics
from server.pipeline.seams import (
    ReplyPiece,
    ReplyRequest,
    ReplyStanding,
    TurnPipeline,
    TurnTrace,
    engines_busy,
    one_piece,
    speech_pieces,
)
from server.runtime.events import OwnToolRan, ResponseDone
from server.runtime.history import CacheClass
from server.runtime.session import REPLYING, Session
from server.runtime.session_view import SessionView
from server.runtime.tools import FunctionCall, ToolSettings
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag, StaleWork
from server.tasks import cancel
from server.wire.outbound import ResponseTimings, TranscriptDelta, TranscriptionCompleted
from server.wire.protocol import error_event
from server.wire.realtime_session import TurnSettings

log = logging.getLogger(__name__)

TIMED_STAGES = ("asr_final", "llm_first_token", "first_chunk_text", "first_tts")


@dataclass(eq=False)
class _Run:
    """One reply as it runs: its epoch and trace (the early reply's once adopted), the
    instructions for it (None: the persona), whether it is text only, and what it has opened:
    its request, the early reply begun at its turn's pause, its sentence stream."""

    epoch: int
    trace: TurnTrace
    instructions: str | None
    text_only: bool
    utterance: npt.NDArray[np.int16] | None = None
    speech_end: int = 0  # 16 kHz samples into the utterance: where its end-of-turn silence begins
    request: ReplyRequest | None = None
    early: EarlyReply | None = None
    sentences: AsyncIterator[ReplyPiece] | None = None
    tools: ToolSettings | None = None  # this reply's own (``response.create``); None: session's
    script: str | None = None  # words to say instead of the LLM's (an apology)


@dataclass(frozen=True)
class OwnTools:
    """The avatar's own tools (server/avatar/builtin_tools.py), as the conversation offers
    them: ``names()`` those a reply may call now, ``run`` one (its output, JSON text),
    ``follow_up(epoch)``: another reply once the reply of ``epoch`` has played."""

    names: Callable[[], frozenset[str]]
    run: Callable[[FunctionCall], str]
    follow_up: Callable[[int], None]


async def said(script: str) -> AsyncIterator[ReplyPiece]:
    """A reply whose words are given: one chunk."""
    yield script


def with_instructions(request: ReplyRequest, instructions: str | None) -> ReplyRequest:
    """``request`` with ``instructions`` in place of the persona (one reply's own)."""
    if instructions is None:
        return request
    context = tuple(
        replace(entry, text=instructions) if entry.cache_class is CacheClass.ANCHOR else entry
        for entry in request.context
    )
    conditions = replace(request.conditions, persona=instructions)
    return replace(request, context=context, conditions=conditions)


class Replies:
    """Starts, runs and cancels the reply task of a conversation (at most one at a time)."""

    def __init__(
        self,
        session: Session,
        pipeline: TurnPipeline | None,
        config: Config,
        clock: Clock,
        metrics: Metrics,
        lipsync: LipSync,
        partials: Partials,
        emit: Callable[[dict[str, Any]], None],
        flush: Callable[[], None],
        spawn: Callable[[Any, str], asyncio.Task[None]],
        request: Callable[[int], ReplyRequest],
        tag: Callable[[], JobTag],
        settings: Callable[[], TurnSettings] | None = None,
        own_tools: OwnTools | None = None,
    ) -> None:
        """``settings``: the session's (OpenAI ``session.update``): whether a spoken turn is
        answered by itself, and in speech or in text; ``own_tools``: the avatar's own, run
        here when a reply calls one."""
        self._session = session
        self._pipeline = pipeline
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self._lipsync = lipsync
        self._partials = partials
        self._emit = emit
        self._flush = flush
        self._spawn = spawn
        self._request = request
        self._tag = tag
        self._settings = settings or (lambda: TurnSettings.from_config(config))
        self._own = own_tools
        self.task: asyncio.Task[None] | None = None
        self.trace: TurnTrace | None = None
        self.early: EarlyReply | None = None  # begun at the user's pause (early.py)
        self.traces: deque[dict[str, Any]] = deque(maxlen=64)
        self._room = asyncio.Event()  # set by every pull from the playback buffer
        self._voicing = Voicing(session, lipsync, clock, self._announce, self._wait_for_room)

    def room_made(self) -> None:
        """The playback buffer was pulled from: there may be room in the lookahead budget."""
        self._room.set()

    def _announce(self, chunk_id: int) -> None:
        """``avatar.viseme`` events for the chunk's newly queued audio (ahead of its pts)."""
        position = self._session.playback.chunk_position(chunk_id)
        if position is None:
            return
        queued = self._session.chunk(chunk_id).duration
        for event in self._lipsync.placed(chunk_id, position, queued):
            self._emit(event)

    def server_error(self, code: str, message: str) -> None:
        """An engine failed (not the client's fault): ``error.type`` is ``server_error``."""
        self._emit(error_event("server_error", code, message))

    def start(
        self,
        epoch: int,
        trace: TurnTrace,
        utterance: npt.NDArray[np.int16] | None = None,
        speech_end: int = 0,
        instructions: str | None = None,
        text_only: bool | None = None,
        tools: ToolSettings | None = None,
        script: str | None = None,
    ) -> None:
        """Reply to the turn of ``epoch``: to the ``utterance`` (16 kHz; ``speech_end``: where
        its end-of-turn silence begins), or (None) to the conversation as history holds it
        (typed text, ``response.create``); ``instructions`` replace the persona for it;
        ``text_only``: a text reply, no speech (None: as the session says); ``tools``: the
        ones it may call (None: the session's); ``script``: its words, given (no LLM)."""
        spoken = utterance is not None
        if self._pipeline is None:
            plan = ReplyPlan(self._session, epoch, text_only=False)
            self._carry_out_now(plan, plan.without_pipeline(spoken))
            return
        trace.prefill_cached_tokens = self._partials.take_prefill_cached()
        self.trace = trace
        if text_only is None:
            text_only = self._settings().text_only
        run = _Run(epoch, trace, instructions, text_only, utterance, speech_end)
        run.tools, run.script = tools, script
        self.task = self._spawn(self._respond(self._pipeline, run), "reply")

    async def cancel(self) -> None:
        """Stop the reply task (its LLM stream is closed: the engine aborts the request), and
        drop an early reply."""
        self.trace = None
        task, self.task = self.task, None
        await cancel(task)
        await self.drop_early("interrupted")

    # --- an early reply (server/conversation/early.py) ------------------------------------------
    async def begin_early(self, epoch: int) -> bool:
        """Begin the reply to the user's words as history holds them now (a pause where the
        turn waits on), unless one for the same request runs already; none while the engines
        are busy (other sessions' replies go first). Whether one runs now."""
        pipeline = self._pipeline
        if pipeline is None:
            return False
        request = replace(self._request(epoch), standing=ReplyStanding(held=True))
        if request.tools.callable:
            return False  # a reply that may call a tool is not begun before the turn ends
        if self.early is not None and self.early.answers(request):
            return True
        await self.drop_early("the words changed")
        if engines_busy(pipeline):
            return False
        trace = TurnTrace(endpoint_ms=self._clock.now_ms(), early=True)
        early = EarlyReply(request, trace, aiter(pipeline.reply(request, trace)))
        early.task = self._spawn(self._prepare(pipeline, early), "early-reply")
        self.early = early
        log.debug("session %s: early reply begun", self._session.session_id[:8])
        return True

    async def drop_early(self, why: str) -> None:
        """Drop the early reply, if any: nothing of it was heard."""
        early, self.early = self.early, None
        if early is not None:
            await self._drop(early, why)

    async def _drop(self, early: EarlyReply, why: str) -> None:
        await early.close()
        self._metrics.early_replies.labels("dropped").inc()
        log.debug("session %s: early reply dropped: %s", self._session.session_id[:8], why)

    async def _prepare(self, pipeline: TurnPipeline, early: EarlyReply) -> None:
        """The early reply's first sentence and its speech; a failure only marks it (the
        turn's reply then starts afresh, and meets the failure itself if it lasts)."""
        limit_s = self._config.pipeline.stage_timeout_s
        try:
            async with asyncio.timeout(limit_s):
                early.first = await anext(early.sentences, None)
                if early.first is None or early.standing.shed:
                    return
                if not isinstance(early.first, str):  # a call: for the turn's reply to make
                    early.failed = True
                    return
                conditions = early.request.conditions

                def view() -> SessionView:
                    """Until adopted nobody waits for it: after work someone waits for, as
                    partials go; adopted, as the session's reply."""
                    return self._partials.view() if early.standing.held else self._session.view()

                tag = JobTag(early.request.session_id, early.request.epoch, view)
                early.audio = await pipeline.synthesize(early.first, conditions, tag)
            early.trace.first_tts_ms = self._clock.now_ms()
        except Exception as exc:  # StaleWork, a timeout, an engine's error
            early.failed = True
            log.info("session %s: early reply failed: %r", self._session.session_id[:8], exc)

    async def _wait_for_room(self) -> None:
        """Stop pulling reply text while the lookahead budget is full; go on as it drains."""
        while self._session.playback.space == 0:
            self._room.clear()
            await self._room.wait()

    async def _respond(self, pipeline: TurnPipeline, run: _Run) -> None:
        """The reply's course as its plan (``ReplyPlan``) decides, carried out."""
        session = self._session
        limit_s = self._config.pipeline.stage_timeout_s  # each engine call: ASR, text, TTS
        run.early, self.early = self.early, None  # this turn's, begun at its pause
        plan = ReplyPlan(
            session,
            run.epoch,
            run.text_only,
            instructions=run.instructions is not None,
            early=run.early is not None,
            incremental=self._config.pipeline.incremental,
            limit_s=limit_s,
        )
        try:
            if run.utterance is None:
                run.trace.asr_final_ms = run.trace.endpoint_ms
            await self._carry_out(pipeline, plan, run, plan.begin(run.utterance is not None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # StaleWork, a timeout, an engine's error
            if isinstance(exc, StaleWork):
                pass  # a barge-in ended this reply's epoch while its job waited
            elif isinstance(exc, TimeoutError):
                log.error(
                    "session %s: an engine call took over %g s", session.session_id[:8], limit_s
                )
            else:
                log.exception("session %s: reply failed", session.session_id[:8])
            self._carry_out_now(plan, plan.failed(exc))
        finally:
            self._flush()
            early = run.early
            if early is not None and early.adopted:
                await early.close()  # its stream ended (or the reply was cancelled)
            elif early is not None:
                await self._drop(early, "its turn's reply asked otherwise")

    async def _carry_out(
        self, pipeline: TurnPipeline, plan: ReplyPlan, run: _Run, actions: Actions
    ) -> None:
        """Carry out the plan's ``actions`` in order; an ask's outcome is told back to the plan,
        and what it returns is carried out next."""
        pending = deque(actions)
        while pending:
            action = pending.popleft()
            told = self._do_now(plan, action)
            if told is None:
                told = await self._do(pipeline, plan, run, action)
            pending.extend(told)

    def _carry_out_now(self, plan: ReplyPlan, actions: Actions) -> None:
        """Carry out ``actions`` that await nothing (no pipeline, a failure)."""
        pending = deque(actions)
        while pending:
            told = self._do_now(plan, pending.popleft())
            assert told is not None, "an action that awaits, outside the reply task"
            pending.extend(told)

    def _do_now(self, plan: ReplyPlan, action: ReplyAction) -> Actions | None:
        """Carry out ``action`` if it awaits nothing: what the plan says next (an ask's
        outcome told); None for one that awaits."""
        session = self._session
        if isinstance(action, Flush):
            self._flush()
        elif isinstance(action, EmitTranscript):
            completed = TranscriptionCompleted(action.epoch, action.transcript, action.item_id)
            self._emit(completed.to_dict())
        elif isinstance(action, CommitTurn):
            return plan.committed(session.commit_user_turn(action.text, action.answer) is not None)
        elif isinstance(action, StartResponse):
            return plan.started(session.start_response(action.epoch, action.output))
        elif isinstance(action, OpenChunk):
            return plan.opened(session.open_chunk(action.epoch, action.sentence))
        elif isinstance(action, MakeCall):
            return self._make_call(plan, action)
        elif isinstance(action, FollowUp):
            assert self._own is not None
            self._own.follow_up(action.epoch)
        elif isinstance(action, EmitDelta):
            chunk = action.chunk
            delta = TranscriptDelta(
                action.epoch, chunk.chunk_id, chunk.text, action.response_id, action.item_id
            )
            self._emit(delta.to_dict())
        elif isinstance(action, DeliverText):
            session.deliver_text(action.chunk)
        elif isinstance(action, Finish):
            session.finish_response(action.epoch, action.status)
        elif isinstance(action, ServerError):
            self.server_error(action.code, action.message)
        else:
            return None
        return []

    def _make_call(self, plan: ReplyPlan, action: MakeCall) -> Actions:
        """A call the reply made: recorded and told to the client, who runs it; or one of the
        avatar's own tools, run here, its call and output in history and told as one
        ``avatar.tool`` event (a client need not know tools it did not offer)."""
        call, session = action.call, self._session
        own = self._own is not None and call.name in self._own.names()
        if not own:
            return plan.called(session.record_call(action.epoch, call))
        assert self._own is not None
        if not session.record_call(action.epoch, call, told=False):
            return plan.called(False)
        output = self._own.run(call)
        session.add_call_output(call.call_id, output, told=False)
        tool = OwnToolRan(action.epoch, call.call_id, call.name, call.arguments, output)
        self._emit(tool.to_dict())
        return plan.called(True, own=True)

    async def _do(
        self, pipeline: TurnPipeline, plan: ReplyPlan, run: _Run, action: ReplyAction
    ) -> Actions:
        """Carry out ``action``, which awaits an engine, the early reply or room (or starts a
        task): what the plan says next."""
        limit_s = self._config.pipeline.stage_timeout_s
        if isinstance(action, Transcribe):
            assert run.utterance is not None
            incremental = self._config.pipeline.incremental
            async with asyncio.timeout(limit_s):
                transcript = await self._partials.final(
                    pipeline, run.utterance, run.speech_end, self._tag(), incremental
                )
            run.trace.asr_final_ms = self._clock.now_ms()
            return plan.transcribed(transcript, self._settings().create_response)
        if isinstance(action, Compose):
            request = with_instructions(self._request(run.epoch), run.instructions)
            if run.tools is not None:
                request = replace(request, tools=run.tools)
            if run.text_only:
                request = replace(request, view=None)  # no playback to run dry: whole sentences
            run.request = request
        elif isinstance(action, TryAdopt):
            assert run.early is not None and run.request is not None
            return plan.answers(run.early.answers(run.request))
        elif isinstance(action, AwaitEarly):
            return await self._await_early(plan, run)
        elif isinstance(action, AdoptEarly):
            self._adopt(run)
        elif isinstance(action, CloseEarly):
            assert run.early is not None
            await run.early.close()  # before this reply's request: the slot is the session's
        elif isinstance(action, OpenStream):
            assert run.request is not None
            if run.script is not None:
                run.sentences = said(run.script)
            else:
                run.sentences = aiter(pipeline.reply(run.request, run.trace))
        elif isinstance(action, NextSentence):
            assert run.sentences is not None
            async with asyncio.timeout(limit_s):
                sentence = await anext(run.sentences, None)
            return plan.sentence(sentence)
        elif isinstance(action, Speak):
            return plan.spoken(await self._speak(pipeline, run, action, limit_s))
        elif isinstance(action, WaitForRoom):
            await self._wait_for_room()
        elif isinstance(action, WarmWhenPlayed):
            self._spawn(self._warm_when_played(pipeline, action.epoch), "window-warm-up")
        else:
            raise AssertionError(f"not a reply action: {action!r}")
        return []

    async def _await_early(self, plan: ReplyPlan, run: _Run) -> Actions:
        """Someone waits for the early reply now: no longer shed, its speech first; it is
        waited for (prepared by then, or a stage's time at most)."""
        early, request = run.early, run.request
        assert early is not None and request is not None
        early.standing.adopt()
        if early.task is not None:
            async with asyncio.timeout(self._config.pipeline.stage_timeout_s):
                await early.task
        usable = not (early.failed or early.standing.shed)
        return plan.prepared(usable, early.audio is not None, request.conditions)

    def _adopt(self, run: _Run) -> None:
        """The reply goes on from its early one: its trace becomes the reply's, with the
        endpoint and the final transcript's time; its sentences, its first one's speech."""
        early = run.early
        assert early is not None
        trace = early.trace
        trace.endpoint_ms, trace.asr_final_ms = run.trace.endpoint_ms, run.trace.asr_final_ms
        trace.prefill_cached_tokens = run.trace.prefill_cached_tokens
        if self.trace is run.trace:
            self.trace = trace
        self._metrics.early_replies.labels("adopted").inc()
        log.debug("session %s: early reply adopted", self._session.session_id[:8])
        early.adopted = True
        run.trace, run.sentences = trace, aiter(early.rest())

    async def _speak(
        self, pipeline: TurnPipeline, run: _Run, action: Speak, limit_s: float
    ) -> bool:
        """The chunk's speech queued for playback as the lookahead budget allows: the early
        reply's first sentence's, made already, or synthesised now. False: it went stale."""
        chunk = action.chunk
        if action.from_early:
            assert run.early is not None and run.early.audio is not None
            pieces = one_piece(run.early.audio)  # the early reply's first sentence (same voice)
        else:
            pieces = speech_pieces(pipeline, chunk.text, self._session.conditions, self._tag())
        return await self._voicing.deliver(chunk, pieces, limit_s, run.trace)

    async def _warm_when_played(self, pipeline: TurnPipeline, epoch: int) -> None:
        """Once the reply has played out, the recent window moves on if it is nearly full
        (``History.make_room``), and then the conversation goes into the LLM's prefix cache
        while the user listens or thinks: the whole moved window, which on a slow CPU takes
        seconds that the next reply would otherwise wait for. A window that stays needs no
        warm-up here (the user's words warm it). Optional work (shed while a reply is being
        written)."""
        session = self._session
        while session.epoch == epoch and session.state in REPLYING:
            self._room.clear()
            await self._room.wait()  # every pull from the playback buffer
        if session.epoch != epoch or session.state is not TurnState.LISTENING:
            return
        if session.history.make_room(self._config.runtime.recent_window_tokens):
            await warm_context(pipeline, self._request(epoch), self._metrics)

    def report(self, done: ResponseDone) -> None:
        """When a reply that was heard ends (completed, or cancelled after it started to
        play): its stage timings, as an event and for /debug."""
        trace, self.trace = self.trace, None
        report = reported(done, trace)
        if report is None:
            return
        event = ResponseTimings(report.epoch, report.status, report.timings)
        self.traces.append({"epoch": report.epoch, "status": report.status, **report.timings})
        self._observe(event.timings)
        self._emit(event.to_dict())

    def _observe(self, timings: dict[str, Any]) -> None:
        metrics = self._metrics
        for stage in TIMED_STAGES:
            value = timings.get(f"{stage}_ms")
            if value is not None:
                metrics.stage_latency.labels(stage).observe(value / 1000)
        if timings.get("voice_to_voice_ms") is not None:
            metrics.voice_to_voice.observe(timings["voice_to_voice_ms"] / 1000)
        metrics.cached_tokens.inc(timings.get("cached_tokens") or 0)
        metrics.prompt_tokens.inc(timings.get("prompt_tokens") or 0)
