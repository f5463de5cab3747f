"""One conversation: the runtime session and everything that acts on it, apart from the peer.

Data flow: 16 kHz frames -> turn detector -> Session (epoch, turn state) -> pipeline
(transcript, reply sentences, speech) -> playback buffer -> pulled by the link's tracks. The
conversation outlives a lost connection for ``session.resume_window_s``: while no link is
attached nothing pulls, so playback pauses at the playback cursor, generation stops at the
lookahead budget, turn deadlines wait and events queue (bounded) for the next link. The
Conversation owns every task it starts and awaits them all in :meth:`close`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from server.avatar.builtin_tools import builtin_tools, run_builtin
from server.avatar.seam import AvatarRenderer
from server.clock import Clock, MonotonicClock
from server.config import Config
from server.conversation.diagnostics import describe
from server.conversation.floor import Floor
from server.conversation.interjection import INTERJECTION_CONTEXT, PREROLL_MS, AskWords
from server.conversation.looks import looks_for
from server.conversation.partials import Partials, warm_context
from server.conversation.playout import Playout
from server.conversation.reply import OwnTools, Replies
from server.conversation.resume import Resumed, ResumeTicket
from server.conversation.turn_actions import (
    DropEarly,
    EndTurn,
    HearUtterance,
    PauseReply,
    ResumeReply,
    TakeFloor,
    TranscribeInterjection,
    TurnAction,
)
from server.conversation.utterance import Utterance
from server.metrics import Metrics
from server.owner import NO_OWNER
from server.pipeline.echo import EchoPath
from server.pipeline.seams import (
    PrimedTranscripts,
    ReplyRequest,
    SessionScoped,
    TurnPipeline,
    TurnTrace,
    engines_busy,
)
from server.pipeline.turn_detector import TurnDetector, VadEvent
from server.runtime.budget import Rate
from server.runtime.events import ResponseDone
from server.runtime.history import Role
from server.runtime.media import MEDIA_RATE_HZ, pcm_level, samples_to_ms
from server.runtime.session import BargeIn, Session
from server.runtime.tools import NO_TOOLS, FunctionCall, FunctionTool, ToolSettings
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag, StaleWork
from server.tasks import TaskOwner, cancel
from server.vision.sampling import PresenceTracker, VisionModel, presence_note
from server.wire.commands import handle
from server.wire.inbox import Inbox
from server.wire.link import Link
from server.wire.outbound import SessionCreated
from server.wire.outlet import Outlet
from server.wire.realtime_client import RealtimeEvent, parse_native_event, parse_realtime_event
from server.wire.realtime_session import SessionPatch, TurnSettings, session_object
from server.wire.realtime_wire import RealtimeWire

log = logging.getLogger(__name__)

REALTIME_DIALECT = "realtime"  # the oai-events channel: OpenAI Realtime GA events
TURN_WATCH_S = 0.1  # how often the turn's deadline is checked
# a new conversation's memory: 0.48 MB of RSS each for 200 made at once (no pipeline, no
# avatar; 2026-12-07), rounded up for what a real one's avatar and lip-sync add
BASE_HELD_BYTES = 1 << 20
EVENT_HELD_BYTES = 1024  # an event kept for the client, as a dict (its transcripts short)
# what a call whose output never came says in history, and what the agent says then
CALL_TIMED_OUT = '{"error": "the function gave no result in time"}'
CALL_APOLOGY = "Sorry, I could not get an answer to that in time."


@dataclass(frozen=True)
class _FollowUp:
    """A reply asked for (``response.create`` after a call's output) while the reply of
    ``epoch`` still plays: it starts when that one has played out."""

    epoch: int
    instructions: str | None
    text_only: bool | None
    tools: ToolSettings | None


class Conversation:
    """One conversation, attached to at most one link at a time."""

    def __init__(
        self,
        session_id: str,
        config: Config,
        detector: TurnDetector,
        pipeline: TurnPipeline | None,
        metrics: Metrics,
        renderer: AvatarRenderer | None = None,
        vision: VisionModel | None = None,
        owner: str = NO_OWNER,
        clock: Clock | None = None,
    ) -> None:
        """``owner``: digest of the token that created it (NO_OWNER: no auth); ``clock``: the
        runtime's time (turn deadlines, traces); media tracks keep real time whatever it is."""
        self.session_id = session_id
        self.owner = owner
        self.config = config
        self.clock = clock or MonotonicClock()
        # an appearance the renderer does not have is refused like any invalid update
        self.appearances = () if renderer is None else renderer.appearances
        choices = {"appearance": (*self.appearances, "default")} if self.appearances else {}
        self.session = Session(session_id, config.runtime, self.clock, choices=choices)
        self.detector = detector
        self.pipeline = pipeline
        self.metrics = metrics
        self._tasks = TaskOwner(f"session {session_id[:8]}")
        self.outlet = Outlet()
        self.wire = RealtimeWire(self.session_view, lambda: self.session.conditions.voice)
        self.turn_settings = self._turn(TurnSettings.from_config(config))
        self.tools = NO_TOOLS  # the functions the session's replies may call
        self._follow_up: _FollowUp | None = None
        self._own_followed = ""  # the user item after which a reply followed the own tools
        self.detached_since_ms: float | None = None  # when the last link was lost
        self.inbox = Inbox(
            session_id,
            config.transport.max_event_bytes,
            self.emit,
            Rate(config.session.max_events_per_s, config.session.events_burst),
            config.session.flood_s,
            self.clock,
            metrics.session_rate_limited.labels("events").inc,
        )
        self._resampler: av.AudioResampler | None = None
        self.echo = EchoPath(detector.echo)  # the avatar's voice out of what is heard
        self.ticket = ResumeTicket(session_id)
        self.utterance = Utterance()
        self.partials = Partials(
            self.session,
            detector,
            self.utterance,
            metrics,
            self.clock,
            config.pipeline.partial_interval_ms,
            self.emit,
            self.request,
        )
        looks = looks_for(
            self.session,
            config,
            renderer,
            vision,
            self.clock,
            metrics,
            self._engines_busy,
            self._presence_changed,
        )
        self.lipsync, self.animator = looks.lipsync, looks.animator
        self.camera, self.avatar = looks.camera, looks.avatar
        self.gestures = looks.gestures  # face cues: the avatar's built-in tools
        self.replies = Replies(
            self.session,
            pipeline,
            config,
            self.clock,
            metrics,
            self.lipsync,
            self.partials,
            self.emit,
            self.flush_events,
            self._tasks.spawn,
            self.request,
            self.tag,
            lambda: self.turn_settings,
            OwnTools(self._own_tool_names, self._run_own_tool, self._follow_own_tools),
        )
        self.playout = Playout(self.session, self.avatar, metrics, self.clock)
        incremental = pipeline is not None and config.pipeline.incremental
        self.floor = Floor(
            self.session,
            detector,
            self.utterance,
            self.partials,
            config,
            metrics,
            self.clock,
            lambda: self.turn_settings,
            incremental,
        )
        self._partials_task: asyncio.Task[None] | None = None
        self._words_task: asyncio.Task[None] | None = None

    # --- tasks ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the turn watch and the client-event handler (once, in the running loop)."""
        self._tasks.spawn(self._watch_turn(), "turn-watch")
        self._tasks.spawn(self.inbox.serve(self.handle), "client-events")
        if self._warms:
            assert self.pipeline is not None
            warm = warm_context(self.pipeline, self.request(self.session.epoch), self.metrics)
            self._tasks.spawn(warm, "persona-warm-up")

    @property
    def _warms(self) -> bool:
        """Whether the conversation warms the LLM's prefix cache while nobody waits."""
        return self.pipeline is not None and self.config.pipeline.incremental

    async def close(self) -> None:
        """Stop everything this conversation runs; the engines forget it."""
        await self._tasks.stop(self.partials.abandon_decode())
        await self.replies.drop_early("the conversation closed")  # its LLM request ends
        if isinstance(self.pipeline, SessionScoped):
            self.pipeline.forget(self.session_id)
        for stage, count in self.session.stale_dropped.items():
            self.metrics.stale_dropped.labels(stage.name.lower()).inc(count)

    # --- the link ---------------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return self.outlet.link is not None

    def held_bytes(self) -> int:
        """An estimate of the memory this conversation holds (bytes): a new one's
        (``BASE_HELD_BYTES``), its unplayed speech and the user's utterance (16-bit samples),
        its history's text and the events kept for its client (``EVENT_HELD_BYTES`` each)."""
        speech = self.session.playback.buffered * 2
        said = sum(len(turn.text) for turn in self.session.history.turns) * 4  # UCS-4 at most
        events = self.outlet.kept() * EVENT_HELD_BYTES
        return BASE_HELD_BYTES + speech + self.utterance.samples * 2 + said + events

    def session_view(self) -> dict[str, Any]:
        """The session as the OpenAI Realtime GA dialect describes it."""
        conditions, turn = self.session.conditions, self.turn_settings
        return session_object(
            self.session_id, self.config, conditions.persona, conditions.voice, turn, self.tools
        )

    def configure(self, patch: SessionPatch) -> None:
        """A GA ``session.update``: its conditions queued for the next chunk boundary (checked
        first: an invalid one changes nothing), its turn detection from the next frame on."""
        if patch.conditions:
            self.session.request_update(dict[str, object](patch.conditions))
        self.turn_settings = settings = self._turn(patch.apply_turn(self.turn_settings))
        self.utterance.preroll_ms = settings.prefix_ms
        tools, self.tools = self.tools, patch.apply_tools(self.tools)
        if self.tools != tools and self.tools.tools and self._warms:
            # the prompt's head changed (the tools are listed in it): read it in now, while
            # nobody waits, not when the user's first request does
            assert self.pipeline is not None
            warm = warm_context(self.pipeline, self.request(self.session.epoch), self.metrics)
            self._tasks.spawn(warm, "tools-warm-up")

    def _turn(self, settings: TurnSettings) -> TurnSettings:
        """``settings`` as the turn detector can apply them (``semantic`` needs its model)."""
        if settings.semantic and self.detector.completeness is None:
            log.debug("session %s: no end-of-turn model: semantic_vad off", self.session_id[:8])
            settings = replace(settings, semantic=False)
        self.detector.tune(settings.threshold, settings.end_of_turn_ms)
        return settings

    def attach(self, link: Link) -> None:
        """``link`` carries the conversation from now on (a first connection, or a resume:
        turn deadlines resume where they stopped, media time goes on from the cursor)."""
        if self.detached_since_ms is not None:
            paused = self.clock.now_ms() - self.detached_since_ms
            self.session.turn.pause_for(paused)
            log.info("session %s resumed after %.0f ms", self.session_id[:8], paused)
        self.outlet.attach(link)
        self.detached_since_ms = None
        self.playout.base_ms = samples_to_ms(self.session.cursors.playback_cursor)
        self._resampler = None  # a new inbound stream
        self.echo.restart()

    def detach(self, link: Link) -> None:
        """``link`` is lost (if it is still the one attached): wait for a new one."""
        if self.outlet.link is link:
            self.outlet.attach(None)
            self.detached_since_ms = self.clock.now_ms()
            log.info("session %s: connection lost, waiting for a resume", self.session_id[:8])

    def link_open(self, audio: bool, video: bool, resumed: Resumed, dialect: str) -> None:
        """The link's events channel opened, speaking ``dialect`` (``native``, or ``realtime``:
        OpenAI Realtime GA): ``session.created`` (a new resume token), on a resume the events
        a lost link took after the client's last one, then those kept for it, in order."""
        realtime = dialect == REALTIME_DIALECT
        self.inbox.parse = parse_realtime_event if realtime else parse_native_event
        resume_s = self.config.session.resume_window_s
        token = self.ticket.issue() if resume_s > 0 else None
        created = SessionCreated.of(self.session, self.appearances, (audio, video), token, resume_s)
        created = replace(created, resumed=resumed is not None)
        after = None if resumed is None else resumed.after
        self.outlet.open(created.to_dict(), self.wire.translate if realtime else None, after)

    def emit(self, event: dict[str, Any]) -> None:
        """Send ``event`` to the client now, or as soon as a link can take it."""
        self.outlet.send(event)

    def flush_events(self) -> None:
        """Send what the runtime session emitted; a reply that ended reports its timings."""
        self.outlet.flush()  # events kept while the link could not take them go first
        for event in self.session.drain_events():
            self.emit(event.to_dict())
            if isinstance(event, ResponseDone):
                self.replies.report(event)
                self._follow(event)

    # --- media out: what the link's tracks pull -------------------------------------------------
    def pull_audio(self, n: int) -> npt.NDArray[np.int16]:
        """The next ``n`` samples (48 kHz) for the link's audio track; every sample pulled is
        the echo canceller's far end, and makes room in the lookahead budget."""
        pcm = self.playout.pull_audio(n)
        self.replies.room_made()
        self.flush_events()
        self.echo.played(pcm)
        return pcm

    def on_cursor_held(self, samples: int) -> None:
        """``samples`` (48 kHz) of media time passed on the link without the playback cursor
        (server/conversation/playout.py); the echo canceller's far end gets the silence the
        client heard."""
        self.playout.on_cursor_held(samples)
        self.echo.played(np.zeros(samples, dtype=np.int16))

    def on_sent(self, pts: int, lateness_s: float, pcm: npt.NDArray[np.int16]) -> None:
        """The link's audio track sent the frame at ``pts`` (samples) ``lateness_s`` late."""
        reaction = self.playout.on_sent(lateness_s, pcm, self.replies.trace)
        if reaction is not None:
            ms = reaction.reaction_ms
            log.info("session %s barge-in reaction %.0f ms", self.session_id[:8], ms)
            self.emit(reaction.to_dict())

    async def face_at(self, media_ms: float) -> av.VideoFrame:
        """The avatar's picture at ``media_ms`` on the link's media clock (needs a renderer)."""
        return await self.playout.face_at(media_ms)

    # --- frames in ----------------------------------------------------------------------------
    async def hear(self, frame: av.AudioFrame, arrival_ms: float) -> None:
        """One inbound audio frame (any rate): resampled to 16 kHz mono, the avatar's echo
        taken out (server/pipeline/echo.py), for the detector and the recogniser."""
        if self._resampler is None:
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=16_000)
        self.session.input.advance_heard(frame.samples * MEDIA_RATE_HZ // frame.sample_rate)
        link = self.outlet.link
        for out in self._resampler.resample(frame):
            inbound = self.echo.clean(out.to_ndarray().reshape(-1).astype(np.int16))
            pcm, voice = inbound.words, inbound.voice
            if len(inbound.rewind):
                self.utterance.repair(inbound.rewind)
            media_ms = None if link is None else link.media_ms()
            if media_ms is not None:  # never started by inbound audio
                self.animator.hear_user(media_ms + self.playout.base_ms, pcm_level(voice))
            for event in self.detector.push(voice, arrival_ms, inbound.heard):
                await self.on_vad(event)
            self.keep_audio(pcm)
            if self.session.state is TurnState.USER_SPEAKING:
                self.partials.heard()  # the partial loop looks at once (a pause may have begun)
            early = self.replies.early is not None
            await self.act(self.floor.after_frames(self.echo.masked_ms, early))

    def keep_audio(self, pcm: npt.NDArray[np.int16]) -> None:
        self.utterance.keep(pcm, self.session.state is TurnState.USER_SPEAKING)

    def _presence_changed(self, presence: PresenceTracker) -> None:
        """Tell the client, and note it in the persona's conditions (next chunk boundary)."""
        self.emit(presence.event().to_dict())
        self.session.observe_presence(presence_note(presence.presence))
        self.flush_events()

    async def on_vad(self, event: VadEvent) -> None:
        """One decision of the turn detector: the floor decides, the conversation acts."""
        await self.act(self.floor.on_vad(event))

    # --- the floor's decisions carried out ----------------------------------------------------
    async def act(self, actions: Sequence[TurnAction]) -> None:
        """Carry out the floor's ``actions`` in order (server/conversation/turn_actions.py),
        then tell the client what the session emitted. One that no longer applies (the session
        moved on while an earlier one was awaited) is skipped."""
        if not actions:
            return  # most frames: nothing decided, nothing to tell
        for action in actions:
            if isinstance(action, PauseReply):
                if self.session.pause_reply():
                    self.playout.barged_in(action.arrival_ms, action.arrival_ms)
            elif isinstance(action, ResumeReply):
                if self.session.state is TurnState.PAUSED:
                    self.session.resume_reply(action.reason)
            elif isinstance(action, TakeFloor):
                await self._take_floor(action)
            elif isinstance(action, EndTurn):
                await self._end_turn(action.at_ms)
            elif isinstance(action, HearUtterance):
                probe = self._hear_utterance(action, self.utterance.audio())
                self._tasks.spawn(probe, "end-of-turn")
            elif isinstance(action, TranscribeInterjection):
                await cancel(self._words_task)
                words = self._transcribe_interjection(action.ask)
                self._words_task = self._tasks.spawn(words, "interjection-words")
            elif isinstance(action, DropEarly):
                await self.replies.drop_early(action.reason)
        self.flush_events()

    async def _take_floor(self, action: TakeFloor) -> None:
        """The user's speech starts; over a reply, the session bumps its epoch (a barge-in)."""
        barge = self.session.speech_started(action.at_ms)
        if barge is not None:
            if action.onset_arrival_ms is not None:  # not paused first: timed from here
                confirmed = action.confirmed_arrival_ms or action.onset_arrival_ms
                self.playout.barged_in(action.onset_arrival_ms, confirmed)
            await self._interrupted(barge)
        if not action.begin:
            return
        self.utterance.begin(action.back_ms)
        self.partials.reset()
        if action.partials and self.pipeline is not None:
            run = self.partials.run(
                self.pipeline, self.floor.ending, self._reply_early, action.judge_words
            )
            self._partials_task = self._tasks.spawn(run, "partials")

    async def _end_turn(self, at_ms: float) -> None:
        """The user's turn ends at ``at_ms`` (input timeline): transcribe it and reply."""
        await self._stop_partials()
        if self.session.state is not TurnState.USER_SPEAKING:
            return  # typed text or a cleared input ended it meanwhile
        trace = TurnTrace(endpoint_ms=self.clock.now_ms())
        self.session.speech_stopped(at_ms)
        utterance = self.utterance.take()
        silence = int((self.detector.position_ms - at_ms) * 16)  # samples of the turn's end
        speech_end = max(0, len(utterance) - silence)
        self.replies.start(self.session.epoch, trace, utterance=utterance, speech_end=speech_end)

    async def _stop_partials(self) -> None:
        task, self._partials_task = self._partials_task, None
        self.floor.partials_stopped()
        await cancel(task)

    async def _reply_early(self) -> bool:
        """Begin the reply at this pause if the floor allows it (server/conversation/early.py);
        not while the engines are busy. Whether one runs."""
        if not self.floor.may_reply_early():
            return False
        return await self.replies.begin_early(self.session.epoch)

    async def _hear_utterance(self, hearing: HearUtterance, audio: npt.NDArray[np.int16]) -> None:
        """The end-of-turn model hears the utterance (in a worker thread)."""
        model = self.detector.completeness
        assert model is not None
        probability: float | None = None
        try:
            probability = await asyncio.to_thread(model.probability, audio)
        finally:
            self.floor.heard_probability(hearing, probability)

    async def _transcribe_interjection(self, ask: AskWords) -> None:
        """Transcribe the voice over the paused reply (from just before its onset); the judge
        decides on its words."""
        since_ms = self.detector.position_ms - ask.from_ms + PREROLL_MS
        audio = self.utterance.recent(since_ms)
        pipeline, asked_ms = self.pipeline, self.clock.now_ms()
        assert pipeline is not None  # a reply plays, so there is a pipeline
        try:
            if isinstance(pipeline, PrimedTranscripts):
                text = await pipeline.transcribe_primed(audio, self.tag(), INTERJECTION_CONTEXT)
            else:
                text = await pipeline.transcribe(audio, self.tag())
        except StaleWork:
            return  # the pause was decided some other way (typed text, cancel, its deadline)
        except Exception as exc:  # the recogniser failed: the pause's deadline decides
            log.warning("session %s: interjection not transcribed: %s", self.session_id[:8], exc)
            return
        took_ms = self.clock.now_ms() - asked_ms
        await self.act(self.floor.interjection_heard(ask, text, took_ms))

    # --- the one interruption path ------------------------------------------------------------
    async def cancel_reply(self) -> bool:
        """``response.cancel`` (or the client cleared or cut the reply's audio): the reply
        stops, what was heard stays. Whether there was one."""
        barge = self.session.cancel_response()
        await self._interrupted(barge)
        return barge is not None

    async def _interrupted(self, barge: BargeIn | None, barge_in: bool = True) -> None:
        """After the session bumped its epoch (speech, typed text, ``response.cancel``, or a
        missed turn deadline: ``barge_in`` False), or found nothing to interrupt (``barge``
        None): count it, drop the old epoch's mouth cues, tell the client (``response.done``
        cancelled, with the timings of what was heard), and stop the reply task, which closes
        its LLM stream (the engine aborts the request)."""
        if barge is not None:
            if barge_in:
                self.metrics.barge_ins.inc()
            self.metrics.discarded_output.observe(barge.flushed_samples / MEDIA_RATE_HZ)
            self.lipsync.drop_older(self.session.epoch)
        self.flush_events()
        await self.replies.cancel()

    # --- liveness: no turn state outlives its deadline (server/runtime/turn.py) -------------------
    async def _watch_turn(self) -> None:
        while True:
            await asyncio.sleep(TURN_WATCH_S)
            await self.enforce_deadline()
            self.enforce_call_deadlines()

    def enforce_call_deadlines(self) -> None:
        """A function call whose output has not come by its deadline: its output in history
        says so, and when nothing else goes on the agent says it got no answer (a spoken
        apology, not a hang). An output that comes later is kept, and answers nothing."""
        if self.detached_since_ms is not None:
            return
        session = self.session
        due = session.calls.due(self.clock.now_ms())
        if not due:
            return
        for call_id in due:
            session.items.add_call_output(call_id, CALL_TIMED_OUT, session.epoch)
        if session.state is TurnState.LISTENING:
            session.request_response()
            trace = TurnTrace(endpoint_ms=self.clock.now_ms())
            self.replies.start(session.epoch, trace, None, 0, script=CALL_APOLOGY)
        self.flush_events()

    async def enforce_deadline(self) -> None:
        """End the turn state if it passed its deadline: a user turn ends as at a pause; a
        reply (thinking or speaking) stops with a ``timeout`` error naming the late stage.
        While no link is attached the deadlines wait (the playback waits too)."""
        if self.detached_since_ms is not None:
            return
        overdue = self.session.overdue()
        if overdue is None:
            return
        self.metrics.turn_timeouts.labels(overdue.stage).inc()
        log.warning(
            "session %s: %s for %.0f ms (waiting for %s): past its deadline",
            self.session_id[:8],
            overdue.state.value,
            overdue.waited_ms,
            overdue.stage,
        )
        if overdue.state is TurnState.USER_SPEAKING:
            await self.act(self.floor.end_turn(self.detector.position_ms))
            return
        if overdue.state is TurnState.PAUSED:
            await self.act(self.floor.overdue())  # the voice over the reply is judged now
            return
        await self._interrupted(self.session.time_out(overdue), barge_in=False)

    # --- client events ------------------------------------------------------------------------
    def receive(self, raw: str | bytes) -> bool:
        """One client message (from the link's events channel); False when its sender floods
        far past the session's events budget (the link then ends the session)."""
        return self.inbox.receive(raw)

    async def handle(self, event: RealtimeEvent) -> None:
        """One client event (server/wire/commands.py)."""
        await handle(self, event)

    async def typed_text(self, text: str) -> None:
        """Typed text: it supersedes speech in progress, interrupts a reply, and is answered."""
        if self.session.state is TurnState.USER_SPEAKING:
            await self._stop_partials()
            self.utterance.clear()
        _, barge = self.session.submit_text(text)
        await self._interrupted(barge)
        self.answer(None)

    def answer(
        self,
        instructions: str | None,
        text_only: bool | None = None,
        tools: ToolSettings | None = None,
    ) -> None:
        """Reply to the conversation as it stands (the turn is THINKING); ``instructions``
        replace the persona, ``text_only`` the output and ``tools`` the session's tools for
        this reply only."""
        trace = TurnTrace(endpoint_ms=self.clock.now_ms())
        self.replies.start(self.session.epoch, trace, None, 0, instructions, text_only, tools)

    # --- the avatar's own tools (server/avatar/builtin_tools.py) ----------------------------------
    def _own_tools(self) -> tuple[FunctionTool, ...]:
        """The avatar's own tools its replies may call (``avatar.builtin_tools``); a client's
        tool of the same name wins."""
        if not self.config.avatar.builtin_tools:
            return ()
        theirs = {tool.name for tool in self.tools.tools}
        return tuple(t for t in builtin_tools(self.appearances) if t.name not in theirs)

    def _own_tool_names(self) -> frozenset[str]:
        return frozenset(tool.name for tool in self._own_tools())

    def _run_own_tool(self, call: FunctionCall) -> str:
        output = run_builtin(call, self.gestures, self.session.request_update)
        assert output is not None, f"{call.name} is none of the avatar's own tools"
        return output

    def _follow_own_tools(self, epoch: int) -> None:
        """A reply ran the avatar's own tools and said nothing after them: the next reply
        reads their outputs and talks, offered the same tools (the prompt's head stays the
        one the LLM has cached; it makes no call it made already since the user spoke). Once
        per user turn: a reply that again only runs them ends the turn."""
        turns = self.session.history.turns
        asked = next((t.item_id for t in reversed(turns) if t.role is Role.USER), "")
        if asked == self._own_followed:
            log.info(
                "session %s: the avatar's own tools again; no reply follows", self.session_id[:8]
            )
            return
        self._own_followed = asked
        self.answer_when_played(None, None, None)

    def offered_tools(self) -> ToolSettings:
        """The tools a reply may call: the client's, and the avatar's own where they are on."""
        own = self._own_tools()
        if not own:
            return self.tools
        return ToolSettings(self.tools.tools + own, self.tools.choice)

    def answer_when_played(
        self, instructions: str | None, text_only: bool | None, tools: ToolSettings | None
    ) -> None:
        """Reply once the reply now playing has played out (a call's output came while the
        words before the call still play); an interruption first drops it."""
        self._follow_up = _FollowUp(self.session.epoch, instructions, text_only, tools)

    def _follow(self, done: ResponseDone) -> None:
        """A response ended: the reply waiting for it starts, if it played out."""
        follow, self._follow_up = self._follow_up, None
        if follow is None:
            return
        if done.epoch != follow.epoch or self.session.state is not TurnState.LISTENING:
            return  # interrupted meanwhile: the conversation moved on
        self.session.request_response()
        self.answer(follow.instructions, follow.text_only, follow.tools)

    async def client_stopped_reply(self) -> None:
        """A client that plays the audio itself stopped the reply held paused for the voice
        over it (server/conversation/floor.py, ``Floor.client_stopped``)."""
        await self.act(self.floor.client_stopped())

    async def commit_input(self) -> None:
        """``input_audio_buffer.commit``: the user's speech in progress ends its turn now (as at
        a pause), and is answered as the session's turn settings say."""
        if self.session.state is TurnState.USER_SPEAKING:
            await self.act(self.floor.end_turn(self.detector.position_ms))

    async def clear_input(self) -> None:
        """``input_audio_buffer.clear``: the user's speech in progress is dropped."""
        if self.session.state is TurnState.USER_SPEAKING:
            await self._stop_partials()
            self.utterance.clear()
        self.session.clear_input()

    # --- requests to the engines --------------------------------------------------------------
    def tag(self) -> JobTag:
        """Engine jobs of this session are ordered by its live view (slack, waiting since)."""
        return JobTag(self.session_id, self.session.epoch, self.session.view)

    def request(self, epoch: int) -> ReplyRequest:
        return ReplyRequest(
            self.session_id,
            epoch,
            self.session.history.context(self.config.runtime.recent_window_tokens),
            self.session.conditions,
            owner=self.owner,  # its prefix-cache scope (per session when NO_OWNER)
            view=self.session.view,  # its playback slack: cut a chunk short before it runs dry
            tools=self.offered_tools(),
        )

    def _engines_busy(self) -> bool:
        """The shared engines have required work (any session's): shed optional work."""
        return engines_busy(self.pipeline)

    # --- diagnostics ----------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Per-session figures for diagnostics and benchmarks (the debug endpoint)."""
        turns, floor = list(self.replies.traces), self.floor
        judged = {"resumed": floor.resumed, "interrupted": floor.interrupted, **floor.heard.view()}
        session, playout, starts = self.session, self.playout, floor.speech_starts
        figures = describe(session, playout, turns, self.avatar, self.animator, starts, judged)
        return {**figures, "attached": self.attached, "echo": self.echo.describe()}
