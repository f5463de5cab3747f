"""One peer connection carrying a conversation: its RTCPeerConnection, media tracks, events
channel and watchdog.

Inbound audio frames go to the conversation (:meth:`Conversation.hear`), camera frames to its
camera stage; the outbound tracks pull audio and faces from it; its events go out on the
first data channel labelled ``events`` (the native dialect) or ``oai-events`` (OpenAI Realtime
GA events). The peer is the conversation's
:class:`server.wire.link.Link`; when the connection is lost the conversation can
wait for a new peer (a resume). The PeerSession owns every task it starts and awaits them
all in :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from server.clock import MonotonicClock
from server.config import Config
from server.conversation.conversation import REALTIME_DIALECT, Conversation
from server.conversation.resume import Resumed
from server.rtc.face_encoder import encode_as_face
from server.rtc.ice import ice_servers
from server.rtc.ice_teardown import end_consent_checks_with_close
from server.rtc.inbound import Gaps, frames
from server.rtc.jitter import ArrivalBuffer, MediaGuard
from server.rtc.opus import Concealed
from server.rtc.sctp_bounds import InboundGuard, bound_inbound_messages
from server.rtc.settings import (
    add_outbound_track,
    audio_jitter_buffer,
    guard_data_channels,
    rtc_configuration,
    tune_audio_receive,
)
from server.rtc.speech_encoder import speak_as_speech
from server.rtc.tracks import MediaClock, PacedAudioTrack, PacedVideoTrack
from server.runtime.budget import FLOOD_FACTOR, MediaBudget, Rate
from server.tasks import TaskOwner
from server.wire.protocol import quoted

log = logging.getLogger(__name__)

MAX_QUEUED_BYTES = 1024 * 1024  # events queued towards a peer that does not take them
STALL_MS = 500.0  # no inbound audio this long: the path looks dead, output holds its cursor
EVENTS_LABEL = "events"
# the label of a client's events channel -> the dialect the conversation speaks on it
DIALECTS = {EVENTS_LABEL: "native", "oai-events": REALTIME_DIALECT}


class PeerState(Enum):
    NEW = "new"
    CONNECTED = "connected"
    CLOSING = "closing"
    CLOSED = "closed"


class Gone(Enum):
    """Why a peer asks to be taken away."""

    LOST = "lost"  # the connection failed or closed, or its audio stopped
    NEVER_CONNECTED = "never_connected"  # the connect watchdog fired
    OVERFLOWED = "overflowed"  # it left MAX_QUEUED_BYTES of events unread, or sent past the
    # bounds on inbound data (server/rtc/sctp_bounds.py)


class PeerSession:
    """One connection of a conversation, closed as one unit (the conversation lives on)."""

    def __init__(
        self,
        conversation: Conversation,
        config: Config,
        on_gone: Callable[[PeerSession, Gone], None],
        resumed: Resumed = None,
    ) -> None:
        """``resumed``: this peer resumes a conversation whose connection was lost."""
        self.conversation = conversation
        self.session_id = conversation.session_id
        self.owner = conversation.owner  # digest of the creating token (NO_OWNER: no auth)
        self.config = config
        self.resumed = resumed
        self.state = PeerState.NEW
        self.clock = conversation.clock
        # the last inbound audio frame, or the moment ICE connected (the dead-peer reaper's)
        self.last_media_ms = self.clock.now_ms()
        # the TURN server sees the server's own relay allocations under the session's name
        ice = ice_servers(config.transport, time.time(), f"server-{self.session_id[:8]}")
        self.pc = RTCPeerConnection(rtc_configuration(ice))
        self.media_clock = MediaClock(time.monotonic)
        self._on_gone = on_gone
        self._tasks = TaskOwner(f"session {self.session_id[:8]}")
        self._channel: RTCDataChannel | None = None
        self._overflowed = False  # the peer left MAX_QUEUED_BYTES unread: nothing more is sent
        self._refused_channels = 0
        self.inbound: InboundGuard | None = None  # the bounds on its inbound messages
        self.sends_audio = False  # the client offered to receive audio
        self.sends_video = False  # the client offered video and we have a renderer
        self._hears_audio = False  # the client sends audio (every 20 ms, silence too)
        self.stalled_frames = 0  # outbound frames held back while inbound audio had stopped
        self.inbound_gaps = Gaps()  # the microphone's lost packets, heard as silence
        self.audio_track = PacedAudioTrack(
            self.media_clock, self._pull_audio, conversation.on_sent, conversation.on_cursor_held
        )
        self.video_track = (
            PacedVideoTrack(
                self.media_clock,
                conversation.face_at,
                config.transport.video_fps,
                conversation.metrics.work_shed.labels("late_frame").inc,
            )
            if config.transport.video and conversation.avatar is not None
            else None
        )
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_connection_state)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The peer's tasks still running."""
        return self._tasks.running

    # --- lifecycle ------------------------------------------------------------------------
    def _set_state(self, new: PeerState) -> None:
        old, self.state = self.state, new
        log.info("session %s peer: %s -> %s", self.session_id[:8], old.value, new.value)

    async def answer(self, offer_sdp: str) -> RTCSessionDescription:
        """Apply the client's offer and return our answer (ICE gathered: no trickle)."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        tune_audio_receive(self.pc, self._media_guard())
        name = f"session {self.session_id[:8]}"
        guard_data_channels(self.pc, name)
        self.inbound = bound_inbound_messages(self.pc, name, self._sent_past_bounds)
        end_consent_checks_with_close(self.pc)  # a close mid-connect leaks no ICE task
        # on the m-lines the client wants to receive on (none for a pure publisher)
        self.sends_audio = add_outbound_track(self.pc, self.audio_track)
        if self.video_track is not None:
            self.sends_video = add_outbound_track(self.pc, self.video_track)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        speak_as_speech(self.pc)  # mono speech, FEC copies where the offer decodes them
        encode_as_face(self.pc)  # VP8 for a drawn picture: no denoiser
        self._tasks.spawn(self._connect_watchdog(), "watchdog")
        return self.pc.localDescription

    def _sent_past_bounds(self) -> None:
        """The peer sent past the bounds on inbound data (logged there): the session ends."""
        self._gone(Gone.OVERFLOWED)

    def _gone(self, why: Gone) -> None:
        if self.state in (PeerState.NEW, PeerState.CONNECTED):
            self._on_gone(self, why)

    async def _connect_watchdog(self) -> None:
        """Close a peer whose ICE has not connected within ``ice_connect_timeout_s`` (a client
        that never answers holds a slot only that long), or that is not connected (DTLS and
        all) within ``connect_timeout_s``."""
        transport = self.config.transport
        ice_s = min(transport.ice_connect_timeout_s, transport.connect_timeout_s)
        await asyncio.sleep(ice_s)
        if self.state is PeerState.NEW and self.pc.iceConnectionState != "completed":
            log.warning("session %s: ICE not connected within %.0f s", self.session_id[:8], ice_s)
            self._gone(Gone.NEVER_CONNECTED)
            return
        await asyncio.sleep(transport.connect_timeout_s - ice_s)
        if self.state is PeerState.NEW:
            log.warning(
                "session %s: no connection within %.0f s",
                self.session_id[:8],
                self.config.transport.connect_timeout_s,
            )
            self._gone(Gone.NEVER_CONNECTED)

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self.state is PeerState.NEW:
            self._set_state(PeerState.CONNECTED)
            self.last_media_ms = self.clock.now_ms()  # a slow connect is not silence
            if not self.sends_audio:
                self._tasks.spawn(self._play_unsent_audio(), "playout")
        elif state in ("failed", "closed"):
            self._gone(Gone.LOST)

    async def _play_unsent_audio(self) -> None:
        """A client that receives no audio (events only) still has the reply played out: the
        outbound track is pulled on its own media clock, 20 ms a frame, as aiortc would pull it,
        so visemes, transcripts, the playback cursor and ``response.done`` keep real time."""
        with contextlib.suppress(MediaStreamError):
            while True:
                await self.audio_track.recv()

    async def close(self) -> None:
        """Stop everything this peer runs; idempotent. The conversation is left as it is."""
        if self.state in (PeerState.CLOSING, PeerState.CLOSED):
            return
        self._set_state(PeerState.CLOSING)
        self.conversation.detach(self)
        await self._tasks.stop()
        self.audio_track.stop()
        if self.video_track is not None:
            self.video_track.stop()
        self._log_inbound_audio()
        await self.pc.close()
        self._set_state(PeerState.CLOSED)

    def _log_inbound_audio(self) -> None:
        """What the microphone's packets were like: how many, how many carried a FEC copy
        (the sender heard the answer's ``useinbandfec=1``), how many came too late."""
        audio = (t.receiver for t in self.pc.getTransceivers() if t.kind == "audio")
        for buffer in map(audio_jitter_buffer, audio):
            if isinstance(buffer, ArrivalBuffer):
                log.info(
                    "session %s peer: inbound audio: %d packets, %d with a FEC copy, "
                    "%d dropped (late or repeated), %d over the budget, %d gaps joined",
                    self.session_id[:8],
                    buffer.released,
                    buffer.with_copy,
                    buffer.dropped,
                    buffer.limited,
                    buffer.joined,
                )

    # --- the conversation's link --------------------------------------------------------------
    def media_ms(self) -> float | None:
        return self.media_clock.peek_ms()

    def send(self, event: dict[str, Any]) -> bool:
        """Send ``event`` on the events channel; False before it opens or while the path looks
        dead (the conversation keeps it). Past MAX_QUEUED_BYTES queued towards the peer
        (aiortc's ``bufferedAmount``: sent but not yet taken by SCTP, which stalls when the peer
        acknowledges nothing) the session is closed and nothing more is sent."""
        if self._overflowed:
            return True
        channel = self._channel
        if channel is None or channel.readyState != "open" or self._stalled():
            return False  # kept: a stalled path would lose it (a resume delivers it)
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
            self._gone(Gone.OVERFLOWED)
            return True
        channel.send(payload)
        return True

    def _pull_audio(self, n: int) -> npt.NDArray[np.int16]:
        """The conversation's next ``n`` samples, unless the client's audio stopped arriving
        STALL_MS ago: then the path is probably dead (a network change) and what we would send
        is lost, so silence goes out and the playback cursor waits (for the audio to come back,
        or for a resume on a new connection)."""
        if self._stalled():
            self.stalled_frames += 1
            self.conversation.on_cursor_held(n)
            return np.zeros(n, np.int16)
        return self.conversation.pull_audio(n)

    def _stalled(self) -> bool:
        """The client's audio (every 20 ms, silence too) stopped arriving STALL_MS ago."""
        quiet_ms = self.clock.now_ms() - self.last_media_ms
        return self._hears_audio and self.state is PeerState.CONNECTED and quiet_ms > STALL_MS

    # --- inbound media --------------------------------------------------------------------
    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._hears_audio = True
            self._tasks.spawn(self._consume_audio(track), "audio-in")
        else:
            self._tasks.spawn(self.conversation.camera.consume(frames(track)), "video-in")

    async def _consume_audio(self, track: MediaStreamTrack) -> None:
        gaps = self.inbound_gaps
        async for frame in frames(track):
            self.last_media_ms = self.clock.now_ms()
            assert isinstance(frame, av.AudioFrame)
            lost = gaps.before(frame)  # silence where packets were lost: the timeline stays
            if lost is not None:
                self._count_lost(lost, "silence")
                await self.conversation.hear(lost, self.last_media_ms)
            if isinstance(frame.opaque, Concealed):  # made by the decoder for a lost packet
                self._count_lost(frame, frame.opaque.value)
            await self.conversation.hear(frame, self.last_media_ms)

    def _media_guard(self) -> MediaGuard:
        """The inbound audio budget of this connection's receivers (server/rtc/jitter.py), on
        real time as media is (whatever clock the conversation runs on)."""
        transport = self.config.transport
        packets = Rate(transport.max_media_packets_per_s, transport.media_packets_burst)
        budget = MediaBudget(packets, transport.max_media_gap_ms, self.config.session.flood_s)
        limited = self.conversation.metrics.session_rate_limited

        def flooded() -> None:
            self._flooded("audio packet", packets.per_s)

        return MediaGuard(
            budget, MonotonicClock(), lambda kind: limited.labels(kind).inc(), flooded
        )

    def _count_lost(self, frame: av.AudioFrame, heard_as: str) -> None:
        seconds = frame.samples / frame.sample_rate
        self.conversation.metrics.inbound_lost.labels(heard_as=heard_as).inc(seconds)

    # --- events channel ---------------------------------------------------------------------
    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        """The first channel labelled ``events`` or ``oai-events`` carries the session's events
        in its dialect; every other channel is closed at once (no task, no ``session.created``;
        the first refusal of a session is logged)."""
        dialect = DIALECTS.get(channel.label)
        if dialect is None or self._channel is not None:
            self._refuse_channel(channel)
            return
        self._channel = channel
        channel.on("message", self._receive)
        audio, video = self.sends_audio, self.sends_video
        self.conversation.link_open(audio, video, self.resumed, dialect)

    def _receive(self, raw: str | bytes) -> None:
        """One message on the events channel, for the conversation; a sender that floods far
        past the session's events budget ends the session."""
        if not self.conversation.receive(raw):
            self._flooded("events", self.config.session.max_events_per_s)

    def _flooded(self, what: str, per_s: float) -> None:
        """The peer sent ``what`` at over FLOOD_FACTOR times its ``per_s`` a second for
        ``session.flood_s``: the session ends, as one that leaves its events unread."""
        log.warning(
            "session %s: %s flood (over %gx %g a second for %g s); closing the session",
            self.session_id[:8],
            what,
            FLOOD_FACTOR,
            per_s,
            self.config.session.flood_s,
        )
        self.conversation.metrics.sessions_let_go.labels("flooded").inc()
        self._gone(Gone.OVERFLOWED)

    def _refuse_channel(self, channel: RTCDataChannel) -> None:
        self._refused_channels += 1
        if self._refused_channels == 1:
            log.info(
                "session %s: refusing data channel %s (only the first 'events' or 'oai-events' "
                "channel is used; further refusals are not logged)",
                self.session_id[:8],
                quoted(channel.label),
            )
        channel.close()

    # --- diagnostics ----------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Per-session figures for diagnostics and benchmarks (the debug endpoint)."""
        return {**self.conversation.describe(), "state": self.state.value}
