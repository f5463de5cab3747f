"""A conversation's link over a WebSocket (``GET /v1/realtime``, OpenAI Realtime GA events):
the client sends its microphone as ``input_audio_buffer.append`` and plays the reply itself.

- Events out: every event the conversation sends goes, in order, through one writer task;
  past ``MAX_QUEUED_BYTES`` unsent the client is not reading and the socket is closed.
- Audio out: a paced player task pulls the conversation's playback (``FRAME_SAMPLES`` at
  48 kHz a pull) and sends the reply's audio, resampled to 24 kHz, as
  ``response.output_audio.delta``; silence between replies (and while a reply is paused) is
  not sent. The client plays audio as it comes, so the player keeps it at most ``lead_ms``
  ahead of what the client can have played, and pulls in real time otherwise: the playback
  cursor stays within ``lead_ms`` of what the client heard. Events the runtime makes during a
  pull (``response.done`` at the end of a reply) go after that pull's audio.
- Audio in: appends are heard at once (``Conversation.hear``, 24 kHz frames), within a budget
  (``server/runtime/budget.py`` ``MediaBudget``: appends a second, and audio at most 1.5x
  real time beyond a burst); commit ends the user's turn now. Every other message goes to the
  conversation's inbox, as on the ``oai-events`` channel.

The link owns its tasks and awaits them in :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from aiohttp import WSCloseCode, WSMsgType, web

from server.clock import MonotonicClock
from server.config import Config
from server.conversation.conversation import REALTIME_DIALECT, Conversation
from server.runtime.budget import FLOOD_FACTOR, Admission, Heard, MediaBudget, Rate
from server.runtime.media import FRAME_SAMPLES, MEDIA_RATE_HZ, samples_to_ms
from server.runtime.turn import TurnState
from server.tasks import TaskOwner
from server.wire.protocol import ProtocolError, decode_event
from server.wire.realtime_audio import (
    RATE_HZ,
    AudioAppend,
    AudioCommit,
    ReplyAudio,
    audio_delta,
    check_formats,
    parse_audio_event,
)

log = logging.getLogger(__name__)

MAX_QUEUED_BYTES = 1024 * 1024  # events unsent to a client that does not read
HOLD_QUEUED_BYTES = 64 * 1024  # unsent past this (~0.8 s of deltas): the cursor waits
LEAD_MS = 240.0  # reply audio sent ahead of what the client can have played (ms)
FRAME_S = FRAME_SAMPLES / MEDIA_RATE_HZ  # one pull (s)
TRUNCATE = "conversation.item.truncate"
SESSION_UPDATE = "session.update"


class SocketLink:
    """One WebSocket carrying a conversation (its :class:`server.wire.link.Link`)."""

    def __init__(
        self,
        conversation: Conversation,
        ws: web.WebSocketResponse,
        config: Config,
        max_message_bytes: int,
        lead_ms: float = LEAD_MS,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        """``max_message_bytes``: the largest client message; ``lead_ms``: reply audio sent
        ahead of the client's playing; ``now``: seconds of the media clock (real time)."""
        self.conversation = conversation
        self.session_id = conversation.session_id
        self.ws = ws
        self._config = config
        self._max_message = max_message_bytes
        self._lead_s = lead_ms / 1000
        self._now = now
        self._tasks = TaskOwner(f"socket {self.session_id[:8]}")
        self._out: deque[str] = deque()
        self._out_bytes = 0
        self._wake = asyncio.Event()
        self._holding: list[dict[str, Any]] | None = None  # events made during a pull
        self._reply: ReplyAudio | None = None  # the reply whose audio plays
        self._resampler: av.AudioResampler | None = None
        self._audio_ids = 0  # deltas are numbered apart from the conversation's events
        self._pts = 0  # samples (48 kHz) pulled
        self._closed = False
        self._close_code = WSCloseCode.OK
        transport = config.transport
        packets = Rate(transport.max_media_packets_per_s, transport.media_packets_burst)
        self._packets_per_s = packets.per_s
        self._budget = MediaBudget(packets, transport.max_media_gap_ms, config.session.flood_s)
        self._budget_clock = MonotonicClock()
        self._throttled = False  # an over-budget append was answered in this episode
        self.sent_audio_ms = 0.0  # reply audio sent (ms), for diagnostics and tests
        conversation.wire.input_ms = lambda: conversation.detector.position_ms
        conversation.attach(self)
        conversation.link_open(True, False, None, REALTIME_DIALECT)

    # --- the conversation's link ----------------------------------------------------------
    def media_ms(self) -> float | None:
        """The output timeline pulled so far (ms); None before the first pull."""
        return samples_to_ms(self._pts) if self._pts else None

    def send(self, event: dict[str, Any]) -> bool:
        """Queue ``event`` for the writer (after the audio of a pull in progress)."""
        if self._holding is not None:
            self._holding.append(event)
            return True
        self._note(event)
        self._queue(event)
        return True

    def _note(self, event: dict[str, Any]) -> None:
        """Which reply's audio plays: from its audio content part to its audio's end."""
        kind = event.get("type")
        if kind == "response.content_part.added" and event.get("part", {}).get("type") == "audio":
            self._reply = ReplyAudio(str(event["response_id"]), str(event["item_id"]))
            self._resampler = None  # a new stream: nothing of the last reply's tail
        elif kind in ("response.output_audio.done", "response.done"):
            self._reply = None

    def _queue(self, event: dict[str, Any]) -> None:
        if self._closed:
            return
        payload = json.dumps(event)
        self._out.append(payload)
        self._out_bytes += len(payload)
        self._wake.set()
        if self._out_bytes > MAX_QUEUED_BYTES:
            log.warning(
                "session %s: %d bytes of events unsent to a client that does not read (cap %d); "
                "closing",
                self.session_id[:8],
                self._out_bytes,
                MAX_QUEUED_BYTES,
            )
            self._end(WSCloseCode.POLICY_VIOLATION)

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start writing and playing (once the socket is open)."""
        self._tasks.spawn(self._write(), "socket-writer")
        self._tasks.spawn(self._play(), "socket-player")

    async def serve(self) -> None:
        """Read the client's messages until the socket closes (or the link ends it)."""
        async for message in self.ws:
            if message.type is WSMsgType.TEXT:
                await self._receive(message.data)
            elif message.type is WSMsgType.BINARY:
                error = ProtocolError("invalid_event", "send events as text messages (JSON)")
                self._emit(error.to_event())
            if self._closed:
                break

    def _end(self, code: WSCloseCode) -> None:
        """Stop taking anything from or for the client; the socket closes with ``code``."""
        if not self._closed:
            self._closed, self._close_code = True, code
            self._out.clear()
            self._wake.set()

    async def close(self, code: WSCloseCode | None = None) -> None:
        """Stop everything this link runs and close the socket (``code``: 1000, or the code
        an overflow or a flood chose); idempotent. The conversation is left as it is."""
        self._end(code or WSCloseCode.OK)
        self.conversation.detach(self)
        await self._tasks.stop()
        if not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.ws.close(code=code or self._close_code)

    # --- events out -----------------------------------------------------------------------
    async def _write(self) -> None:
        """Send the queued events in order; a socket that fails ends the link."""
        ws = self.ws
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            while self._out and not self._closed:
                payload = self._out.popleft()
                self._out_bytes -= len(payload)
                try:
                    await ws.send_str(payload)
                except (ConnectionError, RuntimeError):
                    self._end(WSCloseCode.GOING_AWAY)
        with contextlib.suppress(Exception):
            await ws.close(code=self._close_code)

    def _emit(self, event: dict[str, Any]) -> None:
        self.conversation.emit(event)
        self.conversation.flush_events()

    # --- audio out ------------------------------------------------------------------------
    async def _play(self) -> None:
        """Pull the playback: at most ``lead_s`` ahead of what the client can have played
        while a reply plays, one pull per ``FRAME_S`` of real time otherwise."""
        client_end = due = self._now()  # when the client will have played what it got (s)
        while True:
            delay = due - self._now()
            await asyncio.sleep(max(0.0, delay))
            now = self._now()
            sent = self._pull(max(0.0, now - due))
            if sent:
                client_end = max(client_end, now) + sent / MEDIA_RATE_HZ
                due = max(now, client_end - self._lead_s)
            else:
                due = max(due + FRAME_S, now)

    def _pull(self, lateness_s: float) -> int:
        """One pull; the samples (48 kHz) of reply audio sent."""
        conversation = self.conversation
        if self._out_bytes > HOLD_QUEUED_BYTES:  # the client is not reading: the cursor waits
            conversation.on_cursor_held(FRAME_SAMPLES)
            return 0
        playback = self.conversation.session.playback
        reply, before = self._reply, playback.buffered
        held: list[dict[str, Any]] = []
        self._holding = held
        try:
            pcm = conversation.pull_audio(FRAME_SAMPLES)
        finally:
            self._holding = None
        played = min(FRAME_SAMPLES, max(0, before - playback.buffered))  # the reply's, not gaps
        conversation.on_sent(self._pts, lateness_s, pcm)
        self._pts += FRAME_SAMPLES
        if played and reply is not None:
            out = self._to_24k(pcm[:played])
            if len(out):
                self._audio_ids += 1
                self._queue({**audio_delta(reply, out), "event_id": f"audio_{self._audio_ids:06d}"})
                self.sent_audio_ms += samples_to_ms(played)
        for event in held:
            self._note(event)
            self._queue(event)
        return played if reply is not None else 0

    def _to_24k(self, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """48 kHz to 24 kHz, one resampler a reply (no edge between pulls)."""
        if self._resampler is None:
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE_HZ)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = MEDIA_RATE_HZ
        parts = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        return np.concatenate(parts).astype(np.int16) if parts else np.zeros(0, np.int16)

    # --- messages in ----------------------------------------------------------------------
    async def _receive(self, raw: str) -> None:
        """One client message: audio heard here, every other event to the inbox."""
        try:
            data, event_id, kind = decode_event(raw, self._max_message)
            audio = parse_audio_event(data, event_id, kind)
            if kind == SESSION_UPDATE:
                check_formats(data, event_id)
        except ProtocolError as exc:
            if exc.code in ("invalid_json", "invalid_event", "invalid_utf8"):
                self._inbox(raw)  # answered there, within the events budget
            else:
                self._emit(exc.to_event())
            return
        if isinstance(audio, AudioAppend):
            await self._hear(audio)
        elif isinstance(audio, AudioCommit):
            await self._commit(audio)
        else:
            if kind == TRUNCATE:
                await self._client_stopped(data.get("item_id"))
            self._inbox(raw)

    def _inbox(self, raw: str) -> None:
        if not self.conversation.receive(raw):
            self._flooded("events", self._config.session.max_events_per_s)

    async def _hear(self, append: AudioAppend) -> None:
        """The client's audio, within the audio budget, heard as one 24 kHz frame."""
        if not self._admit(append):
            return
        if not len(append.pcm):
            return
        frame = av.AudioFrame.from_ndarray(append.pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE_HZ
        conversation = self.conversation
        await conversation.hear(frame, conversation.clock.now_ms())

    def _admit(self, append: AudioAppend) -> bool:
        """Within the appends' budget (a rate, and audio at most 1.5x real time beyond a
        burst); over it dropped, answered once an episode; a flood ends the session."""
        now = self._budget_clock.now_ms()
        admission = self._budget.packet(now)
        if admission is Admission.END:
            self._flooded("audio append", self._packets_per_s)
            return False
        taken = admission is Admission.TAKE
        if taken and self._budget.audio(now, append.duration_ms, 0.0) is Heard.DROP:
            taken = False
        if taken:
            self._throttled = False
            return True
        self.conversation.metrics.session_rate_limited.labels("media").inc()
        if not self._throttled:
            self._throttled = True
            message = "audio sent faster than real time: appends are dropped until it slows"
            self._emit(ProtocolError("rate_limited", message, append.event_id).to_event())
        return False

    async def _commit(self, commit: AudioCommit) -> None:
        """Push to talk: the user's turn ends now; nothing to commit is an error."""
        conversation = self.conversation
        if conversation.session.state is not TurnState.USER_SPEAKING:
            message = "no speech to commit: the buffer holds no turn in progress"
            error = ProtocolError("input_audio_buffer_commit_empty", message, commit.event_id)
            self._emit(error.to_event())
            return
        await conversation.commit_input()

    async def _client_stopped(self, item_id: object) -> None:
        """The client truncates the reply the server holds paused for voice over it: it
        stopped playing at that voice (``input_audio_buffer.speech_started``). Speech already
        confirmed interrupts now and becomes the user's turn (else, cancelled, the reply could
        not hear it start); voice not yet confirmed is left to the detector, whose start of
        speech begins the turn once the inbox has cancelled the reply. The inbox then cuts the
        item to what the client played."""
        if item_id == self.conversation.session.items.reply_item_id:
            await self.conversation.client_stopped_reply()

    def _flooded(self, what: str, per_s: float) -> None:
        log.warning(
            "session %s: %s flood (over %gx %g a second for %g s); closing the session",
            self.session_id[:8],
            what,
            FLOOD_FACTOR,
            per_s,
            self._config.session.flood_s,
        )
        self.conversation.metrics.sessions_let_go.labels("flooded").inc()
        self._end(WSCloseCode.POLICY_VIOLATION)
