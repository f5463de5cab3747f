"""One connected peer: its RTCPeerConnection, media tasks, data channel and session runtime.

Data flow: remote audio -> 16 kHz frames -> turn detector -> Session (epoch, turn state) ->
pipeline (transcript, reply sentences, speech) -> playback buffer -> paced tracks -> peer.
The PeerSession owns every task it starts and awaits them all in :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import unicodedata
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from server.avatar.face import FaceAnimator
from server.avatar.lipsync import LipSync, cues_for
from server.avatar.seam import AvatarRenderer
from server.avatar.video import AvatarVideo
from server.clock import Clock, MonotonicClock
from server.config import Config
from server.conversation.protocol import (
    ClientEvent,
    ProtocolError,
    ResponseCancel,
    SessionUpdate,
    TextInput,
    error_event,
    parse_client_event,
    quoted,
)
from server.errors import InvalidConditionUpdate, InvalidTransition
from server.metrics import Metrics, quantile
from server.owner import NO_OWNER
from server.pipeline.seams import ReplyRequest, ReportsLoad, SessionScoped, TurnPipeline, TurnTrace
from server.pipeline.turn_detector import PAUSE_MS, TurnDetector, VadEvent, VadEventKind
from server.rtc.ice import ice_servers
from server.rtc.settings import (
    add_outbound_track,
    guard_data_channels,
    rtc_configuration,
    tune_audio_jitter,
)
from server.rtc.tracks import MediaClock, PacedAudioTrack, PacedVideoTrack
from server.runtime.events import ResponseDone
from server.runtime.inbound import frames
from server.runtime.media import MEDIA_RATE_HZ, pcm_level, samples_to_ms
from server.runtime.session import BargeIn, ChunkAudio, Session
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag, ShedWork, StaleWork
from server.vision.camera import CameraStage
from server.vision.sampling import PresenceTracker, VisionModel, presence_note

log = logging.getLogger(__name__)

PREROLL_FRAMES = 25  # 16 kHz audio kept before a speech start (500 ms), for the transcript
MAX_UTTERANCE_S = 30
MAX_OUTBOX = 256
MAX_QUEUED_BYTES = 1024 * 1024  # events queued towards a peer that does not take them
EVENTS_LABEL = "events"
MAX_INBOX = 64
LOOKAHEAD_SAMPLE_FRAMES = 25  # sample the lookahead every 0.5 s of output
PARTIAL_SLACK_SHARE = 0.9  # partials are scheduled as if 90% of the budget were buffered
TURN_WATCH_S = 0.1  # how often the turn's deadline is checked
PARTIAL_TICK_S = 0.02  # how often the partial loop looks for a pause
MIN_PARTIAL_SAMPLES = 4800  # 300 ms at 16 kHz: shorter utterances get no partial
BUSY_MESSAGE = "Still answering your last message, one moment."


class PeerState(Enum):
    NEW = "new"
    CONNECTED = "connected"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True)
class _Partial:
    """A partial transcript and how many utterance samples (16 kHz) it heard."""

    covered: int
    text: str


def _normalise(word: str) -> str:
    """A word case-folded, without punctuation or symbols."""
    folded = unicodedata.normalize("NFKC", word).casefold()
    return "".join(ch for ch in folded if ch.isalnum())


async def _cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended."""
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def partial_due(
    since_last_ms: float, interval_ms: float, quiet_ms: float, samples: int, covered: int
) -> bool:
    """Whether the partial loop decodes now: an interval after the last partial began, or at
    once when the speaker paused (quiet for PAUSE_MS) after audio the last partial did not
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
    return since_last_ms >= interval_ms or quiet_ms >= PAUSE_MS


def stable_words(previous: str, current: str) -> str:
    """Local agreement of two consecutive partial transcripts: their longest common prefix of
    words (case and punctuation aside), as the words of ``current``."""
    agreed: list[str] = []
    for before, now in zip(previous.split(), current.split(), strict=False):
        if _normalise(before) != _normalise(now):
            break
        agreed.append(now)
    return " ".join(agreed)


class PeerSession:
    """Everything one peer needs, closed as one unit."""

    def __init__(
        self,
        session_id: str,
        config: Config,
        detector: TurnDetector,
        pipeline: TurnPipeline | None,
        metrics: Metrics,
        on_gone: Callable[[str], None],
        renderer: AvatarRenderer | None = None,
        vision: VisionModel | None = None,
        owner: str = NO_OWNER,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: the session runtime's time (turn deadlines, traces); the media tracks
        keep real time whatever it is."""
        self.session_id = session_id
        self.owner = owner  # digest of the token that created the session (NO_OWNER: no auth)
        self.config = config
        self.state = PeerState.NEW
        self.clock = clock or MonotonicClock()
        # the last inbound audio frame, or the moment ICE connected (the dead-peer reaper's)
        self.last_media_ms = self.clock.now_ms()
        # an appearance the renderer does not have is refused like any invalid update
        self.appearances = () if renderer is None else renderer.appearances
        looks = self.appearances
        choices = {"appearance": (*looks, "default")} if looks else {}
        self.session = Session(session_id, config.runtime, self.clock, choices=choices)
        # the TURN server sees the server's own relay allocations under the session's name
        ice = ice_servers(config.transport, time.time(), f"server-{session_id[:8]}")
        self.pc = RTCPeerConnection(rtc_configuration(ice))
        self.media_clock = MediaClock(time.monotonic)
        self._detector = detector
        self._pipeline = pipeline
        self._metrics = metrics
        self._on_gone = on_gone
        self._tasks: set[asyncio.Task[None]] = set()
        self._response: asyncio.Task[None] | None = None
        self._channel: RTCDataChannel | None = None
        self._overflowed = False  # the peer left MAX_QUEUED_BYTES unread: nothing more is sent
        self._refused_channels = 0
        self._outbox: deque[dict[str, Any]] = deque(maxlen=MAX_OUTBOX)
        self._inbox: asyncio.Queue[ClientEvent] = asyncio.Queue(maxsize=MAX_INBOX)
        self._preroll: deque[npt.NDArray[np.int16]] = deque(maxlen=PREROLL_FRAMES)
        self._utterance: list[npt.NDArray[np.int16]] = []
        self._utterance_samples = 0  # 16 kHz samples in _utterance
        self._barge_onset_ms: float | None = None
        self._underruns_seen = 0
        self.barge_in_reactions_ms: list[float] = []  # from the gate's voice onset
        self.barge_in_confirmed_reactions_ms: list[float] = []  # from the confirmed voice
        self._barge_confirmed_ms = 0.0
        self.traces: deque[dict[str, Any]] = deque(maxlen=64)
        self._trace: TurnTrace | None = None
        self._partials: asyncio.Task[None] | None = None
        self._decode: tuple[int, asyncio.Task[str]] | None = None  # (samples heard, decode)
        self._warming: asyncio.Task[None] | None = None  # the partial loop's LLM warm-up
        self._partial = _Partial(0, "")
        self._stable = ""
        self._prefill_cached = 0
        self.speech_starts = 0
        self._pulls = 0
        self.send_log: deque[float] = deque(maxlen=3000)  # lateness (s) of recent audio frames
        self.audio_track = PacedAudioTrack(self.media_clock, self._pull_audio, self._on_sent)
        self.lipsync = LipSync()
        self.animator = FaceAnimator(seed=int.from_bytes(session_id.encode()[:8], "big"))
        self.sends_audio = False  # the client offered to receive audio
        self.sends_video = False  # the client offered video and we have a renderer
        self.camera = CameraStage(
            session_id, config.vision, vision, self.clock, self._presence_changed
        )
        self.avatar = (
            AvatarVideo(
                self.session,
                self.lipsync,
                self.animator,
                renderer,
                self.camera.attention,
                shed=self._engines_busy,
                on_shed=self._metrics.work_shed.labels("frame").inc,
            )
            if renderer is not None
            else None
        )
        self.video_track = (
            PacedVideoTrack(self.media_clock, self.avatar, config.transport.video_fps)
            if config.transport.video and self.avatar is not None
            else None
        )
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_connection_state)

    # --- lifecycle ------------------------------------------------------------------------
    def _set_state(self, new: PeerState) -> None:
        old, self.state = self.state, new
        log.info("session %s peer: %s -> %s", self.session_id[:8], old.value, new.value)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}:{self.session_id[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "session %s task %s failed",
                self.session_id[:8],
                task.get_name(),
                exc_info=task.exception(),
            )

    async def answer(self, offer_sdp: str) -> RTCSessionDescription:
        """Apply the client's offer and return our answer (ICE gathered: no trickle)."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        tune_audio_jitter(self.pc, self.config.transport.jitter_prefetch_packets)
        guard_data_channels(self.pc, f"session {self.session_id[:8]}")
        # on the m-lines the client wants to receive on (none for a pure publisher)
        self.sends_audio = add_outbound_track(self.pc, self.audio_track)
        if self.video_track is not None:
            self.sends_video = add_outbound_track(self.pc, self.video_track)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        self._spawn(self._connect_watchdog(), "watchdog")
        self._spawn(self._watch_turn(), "turn-watch")
        return self.pc.localDescription

    async def _connect_watchdog(self) -> None:
        """Close a peer whose ICE has not connected within ``ice_connect_timeout_s`` (a client
        that never answers holds a slot only that long), or that is not connected (DTLS and
        all) within ``connect_timeout_s``."""
        transport = self.config.transport
        ice_s = min(transport.ice_connect_timeout_s, transport.connect_timeout_s)
        await asyncio.sleep(ice_s)
        if self.state is PeerState.NEW and self.pc.iceConnectionState != "completed":
            log.warning("session %s: ICE not connected within %.0f s", self.session_id[:8], ice_s)
            self._on_gone(self.session_id)
            return
        await asyncio.sleep(transport.connect_timeout_s - ice_s)
        if self.state is PeerState.NEW:
            log.warning(
                "session %s: no connection within %.0f s",
                self.session_id[:8],
                self.config.transport.connect_timeout_s,
            )
            self._on_gone(self.session_id)

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self.state is PeerState.NEW:
            self._set_state(PeerState.CONNECTED)
            self.last_media_ms = self.clock.now_ms()  # a slow connect is not silence
            if not self.sends_audio:
                self._spawn(self._play_unsent_audio(), "playout")
        elif state in ("failed", "closed") and self.state in (PeerState.NEW, PeerState.CONNECTED):
            self._on_gone(self.session_id)

    async def _play_unsent_audio(self) -> None:
        """A client that receives no audio (events only) still has the reply played out: the
        outbound track is pulled on its own media clock, 20 ms a frame, as aiortc would pull it,
        so visemes, transcripts, the playback cursor and ``response.done`` keep real time."""
        with contextlib.suppress(MediaStreamError):
            while True:
                await self.audio_track.recv()

    async def close(self) -> None:
        """Stop everything this peer runs; idempotent."""
        if self.state in (PeerState.CLOSING, PeerState.CLOSED):
            return
        self._set_state(PeerState.CLOSING)
        current = asyncio.current_task()
        tasks: list[asyncio.Task[Any]] = [t for t in self._tasks if t is not current]
        if self._decode is not None:
            tasks.append(self._decode[1])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if isinstance(self._pipeline, SessionScoped):
            self._pipeline.forget(self.session_id)
        self.audio_track.stop()
        if self.video_track is not None:
            self.video_track.stop()
        await self.pc.close()
        for stage, count in self.session.stale_dropped.items():
            self._metrics.stale_dropped.labels(stage.name.lower()).inc(count)
        self._set_state(PeerState.CLOSED)

    # --- inbound media --------------------------------------------------------------------
    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._consume_audio(track), "audio-in")
        else:
            self._spawn(self.camera.consume(track), "video-in")

    async def _consume_audio(self, track: MediaStreamTrack) -> None:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=16_000)
        async for frame in frames(track):
            arrival_ms = self.last_media_ms = self.clock.now_ms()
            assert isinstance(frame, av.AudioFrame)
            self.session.advance_heard(frame.samples * MEDIA_RATE_HZ // frame.sample_rate)
            for out in resampler.resample(frame):
                pcm = out.to_ndarray().reshape(-1).astype(np.int16)
                media_ms = self.media_clock.peek_ms()  # never started by inbound audio
                if media_ms is not None:
                    self.animator.hear_user(media_ms, pcm_level(pcm))
                for event in self._detector.push(pcm, arrival_ms):
                    await self._on_vad(event)
                self._keep_audio(pcm)

    def _keep_audio(self, pcm: npt.NDArray[np.int16]) -> None:
        if self.session.state is TurnState.USER_SPEAKING:
            if self._utterance_samples < MAX_UTTERANCE_S * 16_000:
                self._utterance.append(pcm)
                self._utterance_samples += len(pcm)
        else:
            self._preroll.append(pcm)

    def _presence_changed(self, presence: PresenceTracker) -> None:
        """Tell the client, and note it in the persona's conditions (next chunk boundary)."""
        self._send(presence.event().to_dict())
        self.session.observe_presence(presence_note(presence.presence))
        self._flush_events()

    async def _on_vad(self, event: VadEvent) -> None:
        if event.kind is VadEventKind.START:
            self._metrics.speech_starts.inc()
            self.speech_starts += 1
            barge = self.session.speech_started(event.at_ms)
            if barge is not None:
                self._barge_onset_ms = event.onset_arrival_ms
                self._barge_confirmed_ms = event.confirmed_arrival_ms
                await self._interrupted(barge)
            if self.session.state is TurnState.USER_SPEAKING and self._partials is None:
                self._utterance = list(self._preroll)
                self._utterance_samples = sum(len(p) for p in self._utterance)
                self._preroll.clear()
                self._partial = _Partial(0, "")
                self._stable = ""
                if self._pipeline is not None and self.config.pipeline.incremental:
                    self._partials = self._spawn(self._partial_loop(self._pipeline), "partials")
        elif self.session.state is TurnState.USER_SPEAKING:
            await self._end_user_turn(event.at_ms)
        self._flush_events()

    async def _end_user_turn(self, at_ms: float) -> None:
        """The user's turn ends (the VAD heard a pause from ``at_ms`` on the input timeline, or
        the turn reached its deadline): transcribe it and reply."""
        await self._stop_partials()
        trace = TurnTrace(endpoint_ms=self.clock.now_ms())
        self.session.speech_stopped(at_ms)
        utterance = np.concatenate(self._utterance) if self._utterance else np.zeros(0, np.int16)
        self._utterance = []
        # the audio after this index is the end-of-turn silence
        silence = int((self._detector.position_ms - at_ms) * 16)
        speech_end = max(0, len(utterance) - silence)
        self._start_response(self.session.epoch, trace, utterance=utterance, speech_end=speech_end)

    # --- liveness: no turn state outlives its deadline (server/runtime/turn.py) ----------------
    async def _watch_turn(self) -> None:
        while True:
            await asyncio.sleep(TURN_WATCH_S)
            await self.enforce_deadline()

    async def enforce_deadline(self) -> None:
        """End the turn state if it passed its deadline: a user turn ends as at a pause; a
        reply (thinking or speaking) stops with a ``timeout`` error naming the late stage."""
        overdue = self.session.overdue()
        if overdue is None:
            return
        self._metrics.turn_timeouts.labels(overdue.stage).inc()
        log.warning(
            "session %s: %s for %.0f ms (waiting for %s): past its deadline",
            self.session_id[:8],
            overdue.state.value,
            overdue.waited_ms,
            overdue.stage,
        )
        if overdue.state is TurnState.USER_SPEAKING:
            await self._end_user_turn(self._detector.position_ms)
            self._flush_events()
            return
        await self._interrupted(self.session.time_out(overdue), barge_in=False)

    # --- while the user speaks: partial transcripts and prefill -------------------------------
    async def _partial_loop(self, pipeline: TurnPipeline) -> None:
        """Re-decode the growing utterance every interval, continuing after the words two
        partials agreed on (its stable words); push the stable words into the LLM. A warm-up
        runs beside the decodes, one at a time: waiting for it would delay the decode at the
        speaker's pause, the one that becomes the final transcript."""
        try:
            await self._decode_partials(pipeline)
        finally:  # the turn ended: a warm-up still running is of no use to its reply
            task, self._warming = self._warming, None
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _decode_partials(self, pipeline: TurnPipeline) -> None:
        interval_ms = self.config.pipeline.partial_interval_ms
        last_ms = self.clock.now_ms()
        while True:
            await asyncio.sleep(PARTIAL_TICK_S)
            since = self.clock.now_ms() - last_ms
            quiet, samples = self._detector.quiet_ms, self._utterance_samples
            if not partial_due(since, interval_ms, quiet, samples, self._partial.covered):
                continue
            last_ms = self.clock.now_ms()
            audio = np.concatenate(self._utterance)
            heard = self.session.cursors.heard_until
            tag = JobTag(self.session_id, self.session.epoch, self._partial_view)
            decode = pipeline.partial_transcript(audio, tag, prefix=self._stable)
            job = asyncio.get_running_loop().create_task(decode)
            self._decode = (len(audio), job)
            try:
                text = await asyncio.shield(job)  # the endpoint may still want this decode
            except ShedWork:  # required work went first; the next interval tries again
                self._decode = None
                self._metrics.work_shed.labels("partial").inc()
                continue
            previous, self._partial = self._partial, _Partial(len(audio), text)
            stable = stable_words(previous.text, text)
            self._send(
                {
                    "type": "conversation.item.input_audio_transcription.delta",
                    "transcript": text,
                    "stable": stable,
                }
            )
            if len(stable) > len(self._stable):
                self._stable = stable
                self.session.set_user_transcript(stable)
                if self._warming is None or self._warming.done():
                    if self._warming is not None:
                        await self._warming  # done: its outcome was handled in _warm
                    warm = self._warm(pipeline, self._request(self.session.epoch), heard)
                    self._warming = asyncio.get_running_loop().create_task(warm)

    async def _warm(self, pipeline: TurnPipeline, request: ReplyRequest, heard: int) -> None:
        """Push the stable words into the LLM's prefix cache (``heard``: input samples heard
        when the decode that found them began)."""
        try:
            cached = await pipeline.prefill(request)
        except ShedWork:  # a reply is being written: the warm-up would slow it
            self._metrics.work_shed.labels("prefill").inc()
            return
        self._prefill_cached = max(self._prefill_cached, cached)
        # heard_until only grows: what was heard when the decode began is still heard
        self.session.advance_prefilled(max(self.session.cursors.prefilled_until, heard))

    async def _stop_partials(self) -> None:
        task, self._partials = self._partials, None
        await _cancel(task)

    def _engines_busy(self) -> bool:
        """The shared engines have required work (any session's): shed optional work."""
        return isinstance(self._pipeline, ReportsLoad) and self._pipeline.busy

    # --- replies ----------------------------------------------------------------------------
    def _tag(self) -> JobTag:
        """Engine jobs of this session are ordered by its live view (slack, waiting since)."""
        return JobTag(self.session_id, self.session.epoch, self.session.view)

    def _partial_view(self) -> SessionView:
        """Partial transcripts are nice to have: they go after work someone is waiting for."""
        view = self.session.view()
        return replace(view, slack_ms=view.budget_ms * PARTIAL_SLACK_SHARE, waiting_since_ms=None)

    def _request(self, epoch: int) -> ReplyRequest:
        return ReplyRequest(
            self.session_id,
            epoch,
            self.session.history.context(self.config.runtime.recent_window_tokens),
            self.session.conditions,
            owner=self.owner,  # its prefix-cache scope (per session when NO_OWNER)
        )

    def _start_response(
        self,
        epoch: int,
        trace: TurnTrace,
        utterance: npt.NDArray[np.int16] | None = None,
        speech_end: int = 0,
        text: str | None = None,
    ) -> None:
        if self._pipeline is None:
            if text is None:
                self.session.commit_user_turn("")  # no ASR configured: listen only
            else:
                self.session.finish_response(epoch, "failed")
                self._send_server_error("no_pipeline", "this server has no reply pipeline")
            self._flush_events()
            return
        trace.prefill_cached_tokens, self._prefill_cached = self._prefill_cached, 0
        self._trace = trace
        self._response = self._spawn(
            self._respond(self._pipeline, epoch, trace, utterance, speech_end, text), "reply"
        )

    async def _interrupted(self, barge: BargeIn | None, barge_in: bool = True) -> None:
        """After the session bumped its epoch (speech, typed text, ``response.cancel``, or a
        missed turn deadline: ``barge_in`` False), or found nothing to interrupt (``barge``
        None): count it, drop the old epoch's mouth cues, and stop the reply task."""
        if barge is not None:
            if barge_in:
                self._metrics.barge_ins.inc()
            self._metrics.discarded_output.observe(barge.flushed_samples / MEDIA_RATE_HZ)
            self.lipsync.drop_older(self.session.epoch)
        self._flush_events()  # response.done (cancelled), with the timings of what was heard
        await self._cancel_response()

    async def _cancel_response(self) -> None:
        self._trace = None
        task, self._response = self._response, None
        await _cancel(task)

    async def _final_transcript(
        self, pipeline: TurnPipeline, utterance: npt.NDArray[np.int16], speech_end: int
    ) -> str:
        """The last partial when it already heard all the speech, or the partial decode still
        running if it will have; else decode the utterance now, after its stable words."""
        decode, self._decode = self._decode, None
        if self.config.pipeline.incremental and speech_end > 0:
            if self._partial.covered >= speech_end:
                return self._partial.text
            if decode is not None and decode[0] >= speech_end:
                with contextlib.suppress(Exception):
                    return await decode[1]
        return await pipeline.transcribe(utterance, self._tag(), prefix=self._stable)

    async def _wait_for_room(self) -> None:
        """Stop pulling reply text while the lookahead budget is full; resume as it drains."""
        while self.session.playback.space == 0:
            await asyncio.sleep(0.02)

    async def _respond(
        self,
        pipeline: TurnPipeline,
        epoch: int,
        trace: TurnTrace,
        utterance: npt.NDArray[np.int16] | None,
        speech_end: int,
        text: str | None,
    ) -> None:
        session = self.session
        limit_s = self.config.pipeline.stage_timeout_s  # each engine call: ASR, next text, TTS
        try:
            if text is None:
                assert utterance is not None
                async with asyncio.timeout(limit_s):
                    transcript = await self._final_transcript(pipeline, utterance, speech_end)
                trace.asr_final_ms = self.clock.now_ms()
                if epoch != session.epoch:
                    return
                self._send(
                    {
                        "type": "conversation.item.input_audio_transcription.completed",
                        "epoch": epoch,
                        "transcript": transcript,
                    }
                )
                if session.commit_user_turn(transcript) is None:
                    self._flush_events()
                    return
            else:
                trace.asr_final_ms = trace.endpoint_ms
            if not session.start_response(epoch):
                return
            self._flush_events()
            sentences = aiter(pipeline.reply(self._request(epoch), trace))
            while True:
                async with asyncio.timeout(limit_s):
                    sentence = await anext(sentences, None)
                if sentence is None:
                    break
                chunk = session.open_chunk(epoch, sentence)
                if chunk is None:
                    return
                self._flush_events()
                self._send(
                    {
                        "type": "response.audio_transcript.delta",
                        "epoch": epoch,
                        "chunk_id": chunk.chunk_id,
                        "delta": chunk.text,
                    }
                )
                async with asyncio.timeout(limit_s):
                    audio = await pipeline.synthesize(chunk.text, session.conditions, self._tag())
                if trace.first_tts_ms is None:
                    trace.first_tts_ms = self.clock.now_ms()
                cues = cues_for(audio.phonemes, audio.pcm)
                self.lipsync.add_chunk(chunk.chunk_id, epoch, session.conditions.appearance, cues)
                pcm = audio.pcm
                while True:
                    payload = ChunkAudio(pcm, audio.words, audio.phonemes, final=True)
                    accepted = session.deliver_audio(session.message(chunk, Stage.TTS, payload))
                    if accepted is None:
                        return
                    self._announce_visemes(chunk.chunk_id)
                    pcm = pcm[accepted:]
                    if len(pcm) == 0:
                        break
                    await self._wait_for_room()
                await self._wait_for_room()
            session.finish_response(epoch)
        except asyncio.CancelledError:
            raise
        except StaleWork:
            return  # a barge-in ended this reply's epoch while its job waited
        except TimeoutError:
            log.error("session %s: an engine call took over %g s", self.session_id[:8], limit_s)
            self._send_server_error(
                "engine_timeout", f"an engine took over {limit_s:g} s; reply stopped"
            )
            session.finish_response(epoch, "failed")
        except Exception as exc:
            log.exception("session %s: reply failed", self.session_id[:8])
            self._send_server_error(
                "engine_error", f"the reply failed: {type(exc).__name__}: {exc}"
            )
            session.finish_response(epoch, "failed")
        finally:
            self._flush_events()

    # --- outbound media -------------------------------------------------------------------
    def _pull_audio(self, n: int) -> npt.NDArray[np.int16]:
        pulled = self.session.pull_audio(n)
        underruns = self.session.playback.underruns
        if underruns > self._underruns_seen:
            self._metrics.underruns.inc(underruns - self._underruns_seen)
            self._underruns_seen = underruns
        self._pulls += 1
        if self._pulls % LOOKAHEAD_SAMPLE_FRAMES == 0 and self.session.playback.streaming:
            self._metrics.lookahead.observe(self.session.playback.slack_ms / 1000)
        self._flush_events()
        return pulled.pcm

    def _announce_visemes(self, chunk_id: int) -> None:
        """``avatar.viseme`` events for the chunk's newly queued audio (ahead of its pts)."""
        position = self.session.playback.chunk_position(chunk_id)
        if position is None:
            return
        queued = self.session.chunk(chunk_id).duration
        for event in self.lipsync.placed(chunk_id, position, queued):
            self._send(event)

    def _on_sent(self, pts: int, lateness_s: float, pcm: npt.NDArray[np.int16]) -> None:
        self._metrics.frame_lateness.observe(lateness_s)
        trace = self._trace
        if trace is not None and trace.first_audio_ms is None and pcm.any():
            trace.first_audio_ms = self.clock.now_ms()
        self.send_log.append(lateness_s)
        if self._barge_onset_ms is not None and not pcm.any():
            now = self.clock.now_ms()
            reaction = now - self._barge_onset_ms
            self._barge_onset_ms = None
            self.barge_in_reactions_ms.append(reaction)
            self.barge_in_confirmed_reactions_ms.append(now - self._barge_confirmed_ms)
            self._metrics.barge_in_reaction.observe(reaction / 1000)
            log.info("session %s barge-in reaction %.0f ms", self.session_id[:8], reaction)

    # --- events channel ---------------------------------------------------------------------
    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        """The first channel labelled ``events`` carries the session's events; every other
        channel is closed at once (no task, no ``session.created``; the first refusal of a
        session is logged)."""
        if channel.label != EVENTS_LABEL or self._channel is not None:
            self._refuse_channel(channel)
            return
        self._channel = channel
        channel.on("message", self._on_message)
        self._spawn(self._client_events(), "client-events")
        self._send(
            {
                "type": "session.created",
                "session": {
                    "id": self.session_id,
                    "epoch": self.session.epoch,
                    "persona": self.session.conditions.persona,
                    "voice": self.session.conditions.voice,
                    "appearance": self.session.conditions.appearance,
                    "appearances": list(self.appearances),
                    "audio": self.sends_audio,
                    "video": self.sends_video,
                },
            }
        )
        while self._outbox and channel.readyState == "open":
            self._send(self._outbox.popleft())

    def _refuse_channel(self, channel: RTCDataChannel) -> None:
        self._refused_channels += 1
        if self._refused_channels == 1:
            log.info(
                "session %s: refusing data channel %s (only the first %r channel is used; "
                "further refusals are not logged)",
                self.session_id[:8],
                quoted(channel.label),
                EVENTS_LABEL,
            )
        channel.close()

    def _send(self, event: dict[str, Any]) -> None:
        """Send ``event`` on the events channel (before it opens: keep the last MAX_OUTBOX).
        Past MAX_QUEUED_BYTES queued towards the peer (aiortc's ``bufferedAmount``: sent but
        not yet taken by SCTP, which stalls when the peer acknowledges nothing) the session is
        closed and nothing more is sent."""
        if self._overflowed:
            return
        channel = self._channel
        if channel is None or channel.readyState != "open":
            self._outbox.append(event)
            return
        payload = json.dumps(event)  # ASCII: characters are bytes
        queued = channel.bufferedAmount + len(payload)
        if queued > MAX_QUEUED_BYTES:
            self._overflowed = True
            log.warning(
                "session %s: %d bytes of events queued towards a peer that does not take them "
                "(cap %d); closing the session",
                self.session_id[:8],
                queued,
                MAX_QUEUED_BYTES,
            )
            self._on_gone(self.session_id)
            return
        channel.send(payload)

    def _send_error(self, code: str, message: str, event_id: str | None = None) -> None:
        self._send(ProtocolError(code, message, event_id).to_event())

    def _send_server_error(self, code: str, message: str) -> None:
        """An engine failed (not the client's fault): ``error.type`` is ``server_error``."""
        self._send(error_event("server_error", code, message))

    def _flush_events(self) -> None:
        for event in self.session.drain_events():
            self._send(event.to_dict())
            if isinstance(event, ResponseDone):
                self._report_timings(event)

    def _observe(self, timings: dict[str, Any]) -> None:
        metrics = self._metrics
        for stage in ("asr_final", "llm_first_token", "first_chunk_text", "first_tts"):
            value = timings.get(f"{stage}_ms")
            if value is not None:
                metrics.stage_latency.labels(stage).observe(value / 1000)
        if timings.get("voice_to_voice_ms") is not None:
            metrics.voice_to_voice.observe(timings["voice_to_voice_ms"] / 1000)
        metrics.cached_tokens.inc(timings.get("cached_tokens") or 0)
        metrics.prompt_tokens.inc(timings.get("prompt_tokens") or 0)

    def _report_timings(self, done: ResponseDone) -> None:
        """When a reply that was heard ends (completed, or cancelled after it started to
        play): its stage timings, as an event and for /debug."""
        trace, self._trace = self._trace, None
        if trace is None or trace.first_audio_ms is None:
            return
        timings = {"epoch": done.epoch, "status": done.status, **trace.as_dict()}
        self.traces.append(timings)
        self._observe(timings)
        self._send({"type": "response.timings", **timings})

    def _on_message(self, raw: str | bytes) -> None:
        """One client message: parsed and queued, or answered with one ``error``. Runs inside
        aiortc's receive path, where an exception would end the transport: none escapes."""
        try:
            event = parse_client_event(raw, self.config.transport.max_event_bytes)
        except ProtocolError as exc:
            self._send(exc.to_event())
            return
        except Exception:
            log.exception("session %s: could not parse a client event", self.session_id[:8])
            self._send_server_error("internal_error", "the event could not be handled")
            return
        try:
            self._inbox.put_nowait(event)
        except asyncio.QueueFull:
            self._send_error("rate_limited", "too many events queued", event.event_id)

    async def _client_events(self) -> None:
        """Handles client events one at a time, in order."""
        while True:
            await self._handle(await self._inbox.get())

    async def _handle(self, event: ClientEvent) -> None:
        session = self.session
        try:
            if isinstance(event, SessionUpdate):
                session.request_update(event.changes)
            elif isinstance(event, ResponseCancel):
                barge = session.cancel_response()
                if barge is None:
                    self._send_error(
                        "no_active_response", "there is no reply to cancel", event.event_id
                    )
                await self._interrupted(barge)
            elif isinstance(event, TextInput):
                if session.state is TurnState.USER_SPEAKING:  # typed text supersedes speech
                    await self._stop_partials()
                    self._utterance, self._utterance_samples = [], 0
                _, barge = session.submit_text(event.text)
                await self._interrupted(barge)
                trace = TurnTrace(endpoint_ms=self.clock.now_ms())
                self._start_response(session.epoch, trace, text=event.text)
            else:
                session.ack_playback(event.played_ms)
        except InvalidConditionUpdate as exc:
            self._send_error(exc.code, str(exc), event.event_id)
        except InvalidTransition as exc:  # the turn's state names stay in the log
            log.info("session %s: %s refused: %s", self.session_id[:8], type(event).__name__, exc)
            self._send_error("conversation_busy", BUSY_MESSAGE, event.event_id)
        self._flush_events()

    # --- diagnostics ----------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Per-session figures for diagnostics and benchmarks (the debug endpoint)."""
        cursors = self.session.cursors
        lateness = [late * 1000 for late in self.send_log]
        return {
            "session_id": self.session_id,
            "state": self.state.value,
            "turn": self.session.state.value,
            "epoch": self.session.epoch,
            "heard_until_ms": samples_to_ms(cursors.heard_until),
            "playback_cursor_ms": samples_to_ms(cursors.playback_cursor),
            "acked_playback_ms": self.session.acked_playback_ms,
            "underruns": self.session.playback.underruns,
            "speech_starts": self.speech_starts,
            "barge_in_reactions_ms": list(self.barge_in_reactions_ms),
            "barge_in_confirmed_reactions_ms": list(self.barge_in_confirmed_reactions_ms),
            "turns": list(self.traces),
            "avatar": {
                "frames": self.avatar.frames if self.avatar is not None else 0,
                "nods": self.animator.nods,
                "face": repr(self.avatar.last_state) if self.avatar is not None else None,
            },
            "history": [
                {"role": t.role.value, "text": t.text, "epoch": t.epoch, "truncated": t.truncated}
                for t in self.session.history.turns
            ],
            "audio_frames_logged": len(lateness),
            "frame_lateness_ms": {
                "p50": quantile(lateness, 0.50),
                "p99": quantile(lateness, 0.99),
                "max": max(lateness, default=None),
            },
        }
