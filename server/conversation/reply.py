"""The reply of one turn: the final transcript, the LLM's sentences, their speech queued for
playback within the lookahead budget, and the stage timings of what was heard."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from server.avatar.lipsync import LipSync
from server.clock import Clock
from server.config import Config
from server.conversation.early import EarlyReply
from server.conversation.partials import Partials, warm_context
from server.conversation.voicing import Voicing
from server.metrics import Metrics
from server.pipeline.seams import (
    ReplyRequest,
    ReplyStanding,
    SpeechAudio,
    TurnPipeline,
    TurnTrace,
    engines_busy,
    one_piece,
    speech_pieces,
)
from server.runtime.events import ResponseDone, ResponseStatus
from server.runtime.history import CacheClass
from server.runtime.session import REPLYING, Session
from server.runtime.session_view import SessionView
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag, StaleWork
from server.tasks import cancel
from server.wire.outbound import ResponseTimings, TranscriptDelta, TranscriptionCompleted
from server.wire.protocol import error_event
from server.wire.realtime_session import TurnSettings

log = logging.getLogger(__name__)

TIMED_STAGES = ("asr_final", "llm_first_token", "first_chunk_text", "first_tts")


@dataclass(frozen=True)
class _Reply:
    """One reply: its epoch and trace, the instructions for it (None: the persona), whether it
    is text only."""

    epoch: int
    trace: TurnTrace
    instructions: str | None
    text_only: bool


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
    ) -> None:
        """``settings``: the session's (OpenAI ``session.update``): whether a spoken turn is
        answered by itself, and in speech or in text."""
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
    ) -> None:
        """Reply to the turn of ``epoch``: to the ``utterance`` (16 kHz; ``speech_end``: where
        its end-of-turn silence begins), or (None) to the conversation as history holds it
        (typed text, ``response.create``); ``instructions`` replace the persona for it;
        ``text_only``: a text reply, no speech (None: as the session says)."""
        if self._pipeline is None:
            if utterance is not None:
                self._session.commit_user_turn("")  # no ASR configured: listen only
            else:
                self._session.finish_response(epoch, ResponseStatus.FAILED)
                self.server_error("no_pipeline", "this server has no reply pipeline")
            self._flush()
            return
        trace.prefill_cached_tokens = self._partials.take_prefill_cached()
        self.trace = trace
        if text_only is None:
            text_only = self._settings().text_only
        reply = _Reply(epoch, trace, instructions, text_only)
        self.task = self._spawn(
            self._respond(self._pipeline, reply, utterance, speech_end), "reply"
        )

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

    async def _adopt(self, early: EarlyReply | None, request: ReplyRequest, reply: _Reply) -> bool:
        """Whether the turn's reply goes on from ``early`` (prepared by now); its trace then
        becomes the reply's, with the endpoint and the final transcript's time."""
        if early is None:
            return False
        if reply.instructions is not None or reply.text_only or not early.answers(request):
            return False
        early.standing.adopt()  # someone waits for it now: no longer shed, its speech first
        if early.task is not None:
            async with asyncio.timeout(self._config.pipeline.stage_timeout_s):
                await early.task
        if early.failed or early.standing.shed:
            return False
        trace = early.trace
        trace.endpoint_ms, trace.asr_final_ms = reply.trace.endpoint_ms, reply.trace.asr_final_ms
        trace.prefill_cached_tokens = reply.trace.prefill_cached_tokens
        if self.trace is reply.trace:
            self.trace = trace
        self._metrics.early_replies.labels("adopted").inc()
        log.debug("session %s: early reply adopted", self._session.session_id[:8])
        return True

    async def _wait_for_room(self) -> None:
        """Stop pulling reply text while the lookahead budget is full; go on as it drains."""
        while self._session.playback.space == 0:
            self._room.clear()
            await self._room.wait()

    async def _respond(
        self,
        pipeline: TurnPipeline,
        reply: _Reply,
        utterance: npt.NDArray[np.int16] | None,
        speech_end: int,
    ) -> None:
        session = self._session
        epoch, trace = reply.epoch, reply.trace
        limit_s = self._config.pipeline.stage_timeout_s  # each engine call: ASR, text, TTS
        early, self.early = self.early, None  # this turn's, begun at its pause
        try:
            if utterance is not None:
                incremental = self._config.pipeline.incremental
                async with asyncio.timeout(limit_s):
                    transcript = await self._partials.final(
                        pipeline, utterance, speech_end, self._tag(), incremental
                    )
                trace.asr_final_ms = self._clock.now_ms()
                if epoch != session.epoch:
                    return
                item_id = session.user_item_id or ""
                self._emit(TranscriptionCompleted(epoch, transcript, item_id).to_dict())
                answer = self._settings().create_response
                if session.commit_user_turn(transcript, answer) is None or not answer:
                    self._flush()
                    return
            else:
                trace.asr_final_ms = trace.endpoint_ms
            if not session.start_response(epoch, "text" if reply.text_only else "audio"):
                return
            self._flush()
            await self._speak(pipeline, reply, limit_s, early)
            session.finish_response(epoch)
            if self._config.pipeline.incremental:
                self._spawn(self._warm_when_played(pipeline, epoch), "window-warm-up")
        except asyncio.CancelledError:
            raise
        except StaleWork:
            return  # a barge-in ended this reply's epoch while its job waited
        except TimeoutError:
            log.error("session %s: an engine call took over %g s", session.session_id[:8], limit_s)
            self.server_error("engine_timeout", f"an engine took over {limit_s:g} s; reply stopped")
            session.finish_response(epoch, ResponseStatus.FAILED)
        except Exception as exc:
            log.exception("session %s: reply failed", session.session_id[:8])
            # the engine's own words stay in the log: they may name internal hosts, ports or
            # limits (llama.cpp's "exceeds 2048"), which are no business of the client's
            self.server_error(
                "engine_error", f"the reply failed ({type(exc).__name__}); the server logged why"
            )
            session.finish_response(epoch, ResponseStatus.FAILED)
        finally:
            self._flush()
            if early is not None and early.adopted:
                await early.close()  # its stream ended (or the reply was cancelled)
            elif early is not None:
                await self._drop(early, "its turn's reply asked otherwise")

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

    async def _speak(
        self, pipeline: TurnPipeline, reply: _Reply, limit_s: float, early: EarlyReply | None
    ) -> None:
        """Each sentence of the reply: opened as a chunk, synthesised, queued for playback as
        the lookahead budget allows (a text reply's chunks are committed as they are sent).
        An ``early`` reply that asks the same is adopted: its sentences, its first one's
        speech."""
        session = self._session
        epoch, trace = reply.epoch, reply.trace
        request = with_instructions(self._request(epoch), reply.instructions)
        if reply.text_only:
            request = replace(request, view=None)  # no playback to run dry: whole sentences
        ready: SpeechAudio | None = None  # the early reply's first sentence, spoken ...
        voice = request.conditions  # ... with these conditions
        if early is not None and await self._adopt(early, request, reply):
            early.adopted = True
            trace, ready, sentences = early.trace, early.audio, aiter(early.rest())
        else:
            if early is not None:
                await early.close()  # before this reply's request: the slot is the session's
            sentences = aiter(pipeline.reply(request, trace))
        while True:
            async with asyncio.timeout(limit_s):
                sentence = await anext(sentences, None)
            if sentence is None:
                return
            chunk = session.open_chunk(epoch, sentence)
            if chunk is None:
                return
            self._flush()
            items = session.items
            ids = (items.reply_response_id or "", items.reply_item_id or "")
            delta = TranscriptDelta(epoch, chunk.chunk_id, chunk.text, *ids)
            self._emit(delta.to_dict())
            if reply.text_only:
                session.deliver_text(chunk)
                continue
            if ready is not None and session.conditions == voice:
                pieces = one_piece(ready)  # the early reply's first sentence (the same voice)
            else:
                pieces = speech_pieces(pipeline, chunk.text, session.conditions, self._tag())
            ready = None
            if not await self._voicing.deliver(chunk, pieces, limit_s, trace):
                return
            await self._wait_for_room()

    def report(self, done: ResponseDone) -> None:
        """When a reply that was heard ends (completed, or cancelled after it started to
        play): its stage timings, as an event and for /debug."""
        trace, self.trace = self.trace, None
        if trace is None or trace.first_audio_ms is None:
            return
        event = ResponseTimings(done.epoch, str(done.status), trace.as_dict())
        self.traces.append({"epoch": done.epoch, "status": str(done.status), **trace.as_dict()})
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
