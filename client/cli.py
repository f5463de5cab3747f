"""A command-line WebRTC peer (aiortc): a reference client for integrators, tests and benchmarks.

    python -m client --url http://127.0.0.1:8080 --wav question.wav \\
        --record-audio reply.wav --record-video reply.mp4 --duration 15

It sends the WAV as its microphone (then silence), opens the ``oai-events`` data channel (the
OpenAI Realtime GA events, and the server's own ``x-avatar.*`` ones), prints every server event as
a JSON line, and records the audio and video it receives.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
import wave
from collections import deque
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import numpy.typing as npt
from aiortc import (
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from server.pipeline.resample import resample
from server.rtc.ice import TURN_SCHEMES, IceServer
from server.rtc.inbound import frames
from server.rtc.settings import pin_host_addresses, rtc_configuration
from server.runtime.media import AUDIO_TIME_BASE, FRAME_SAMPLES, MEDIA_RATE_HZ

log = logging.getLogger("client")
PCM = npt.NDArray[np.int16]

# The data channel's label chooses the server's event dialect.
NATIVE_EVENTS = "events"  # the server's own event names and shapes
GA_EVENTS = "oai-events"  # OpenAI Realtime GA events, plus ``x-avatar.*`` extensions


def load_wav(path: Path) -> PCM:
    """A 16-bit PCM WAV file as mono int16 at 48 kHz."""
    with wave.open(str(path)) as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: need 16-bit PCM")
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        if w.getnchannels() > 1:
            pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1).astype(np.int16)
        return resample(pcm, w.getframerate(), MEDIA_RATE_HZ)


def save_wav(path: Path, pcm: PCM, rate: int = MEDIA_RATE_HZ) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype(np.int16).tobytes())


class ScriptedMic(MediaStreamTrack):
    """A microphone that plays queued clips (48 kHz mono) in real time and silence between them.

    ``clip_sent_at`` holds the monotonic time (s) the first frame of each clip was sent.
    """

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._clips: deque[PCM] = deque()
        self._pos = 0
        self._pts = 0
        self._t0: float | None = None
        self._new_clip = False
        self.clip_sent_at: list[float] = []

    def play(self, pcm: PCM) -> None:
        self._clips.append(pcm.astype(np.int16))

    @property
    def busy(self) -> bool:
        return bool(self._clips)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._t0 is None:
            self._t0 = time.monotonic()
        delay = self._t0 + self._pts / MEDIA_RATE_HZ - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        out = np.zeros(FRAME_SAMPLES, np.int16)
        filled = 0
        while filled < FRAME_SAMPLES and self._clips:
            clip = self._clips[0]
            if self._pos == 0:
                self.clip_sent_at.append(time.monotonic())
            take = min(FRAME_SAMPLES - filled, len(clip) - self._pos)
            out[filled : filled + take] = clip[self._pos : self._pos + take]
            filled += take
            self._pos += take
            if self._pos >= len(clip):
                self._clips.popleft()
                self._pos = 0
        frame = av.AudioFrame.from_ndarray(out.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = MEDIA_RATE_HZ
        frame.pts = self._pts
        frame.time_base = AUDIO_TIME_BASE
        self._pts += FRAME_SAMPLES
        return frame


class ClientPeer:
    """One connection to the server, via ``/offer`` (default) or WHIP."""

    def __init__(
        self,
        base_url: str,
        *,
        whip: bool = False,
        video: bool = True,
        audio: bool = True,
        mic: ScriptedMic | None = None,
        camera: MediaStreamTrack | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        configuration: RTCConfiguration | None = None,
        events_label: str = NATIVE_EVENTS,
    ) -> None:
        """``audio``: False offers no audio m-line at all (events only, typed messages);
        ``configuration``: ICE servers and policy (default: none, so no public STUN);
        ``events_label``: the data channel's label, NATIVE_EVENTS or GA_EVENTS (the dialect)."""
        if events_label not in (NATIVE_EVENTS, GA_EVENTS):
            raise ValueError(f"unknown events channel label {events_label!r}")
        self.base_url = base_url.rstrip("/")
        self.whip = whip
        self.want_video = video
        self.want_audio = audio
        self.mic = mic or ScriptedMic()
        self.camera = camera  # sent as our video (sendrecv), else video is receive-only
        self._configuration = configuration or RTCConfiguration(iceServers=[])
        self.events_label = events_label
        self.session_id: str | None = None
        # from the last session description: ``x-avatar.session`` (GA), ``session.created``
        self.resume_token: str | None = None
        self.last_event_id: str | None = None  # of the last event received (said on a resume)
        self.response_id: str | None = None  # the GA response in progress, if any
        self.posted_at = 0.0  # time.monotonic() when the last offer was posted
        self.resumes: list[float] = []  # seconds from each resume POST to its first audio frame
        self.location: str | None = None
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.audio: list[tuple[float, PCM]] = []  # (arrival, mono 48 kHz frame)
        self.audio_pts: list[int] = []  # RTP timestamp (48 kHz) of each frame in ``audio``
        self.video_frames: list[tuple[float, av.VideoFrame]] = []
        self.keep_video_frames = 0  # how many decoded frames to keep (others are counted)
        self.video_count = 0
        self._on_event = on_event
        self._tasks: set[asyncio.Task[None]] = set()
        self._event_signal = asyncio.Event()
        self._new_connection()

    def _new_connection(self) -> None:
        """A fresh peer connection with its events channel (at start, and on a resume)."""
        self.pc = RTCPeerConnection(self._configuration)
        self.channel = self.pc.createDataChannel(self.events_label)
        self.channel_open = asyncio.Event()
        self.channel.on("message", self._on_message)
        self.channel.on("open", self.channel_open.set)
        self.pc.on("track", self._on_track)

    async def connect(self, timeout: float = 15.0, resume_token: str | None = None) -> None:
        """Offer, answer, and wait for the events channel. ``resume_token``: carry on the
        conversation that token names (a resume) instead of starting one."""
        if self.want_audio:
            self.pc.addTrack(self.mic)
        if self.camera is not None:
            self.pc.addTrack(self.camera)
        elif self.want_video:
            self.pc.addTransceiver("video", direction="recvonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = self.pc.localDescription.sdp
        resume = {} if resume_token is None else {"Avatar-Resume-Token": resume_token}
        if resume_token is not None and self.last_event_id is not None:
            resume["Avatar-Last-Event-Id"] = self.last_event_id  # what we got: the rest again
        async with aiohttp.ClientSession() as http:
            self.posted_at = time.monotonic()
            if self.whip:
                headers = {"Content-Type": "application/sdp", **resume}
                async with http.post(f"{self.base_url}/whip", data=offer, headers=headers) as resp:
                    if resp.status != 201:
                        raise RuntimeError(f"WHIP {resp.status}: {await resp.text()}")
                    self.location = resp.headers["Location"]
                    self.session_id = self.location.rsplit("/", 1)[-1]
                    answer = await resp.text()
            else:
                body = {"sdp": offer, "type": "offer"}
                if resume_token is not None:  # the same in the body's fields
                    body["resume_token"] = resume_token
                    if self.last_event_id is not None:
                        body["last_event_id"] = self.last_event_id
                async with http.post(f"{self.base_url}/offer", json=body) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"offer {resp.status}: {await resp.text()}")
                    body = await resp.json()
                    self.session_id = body["session_id"]
                    answer = body["sdp"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.wait_for(self.channel_open.wait(), timeout)

    @property
    def ga(self) -> bool:
        """Whether the channel speaks the OpenAI Realtime GA dialect."""
        return self.events_label == GA_EVENTS

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def say(self, text: str) -> None:
        """A typed user message that gets its own reply. In GA an item alone asks for nothing:
        the reply in progress is cancelled, the item added, then a response asked for."""
        if not self.ga:
            self.send({"type": "conversation.item.create", "text": text})
            return
        if self.response_id is not None:
            self.send({"type": "response.cancel"})
        content = [{"type": "input_text", "text": text}]
        item = {"type": "message", "role": "user", "content": content}
        self.send({"type": "conversation.item.create", "item": item})
        self.send({"type": "response.create"})

    async def resume(self, timeout: float = 15.0) -> float:
        """After the connection was lost: a new one carries on the same conversation (the
        resume token the server gave last). Returns the seconds from the resume POST to the
        first audio frame received on it (0 without audio)."""
        if self.resume_token is None:
            raise RuntimeError("no resume token: the server sent none (or it was used)")
        token, self.resume_token = self.resume_token, None
        old = self.pc
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(old.close(), 2.0)
        self.mic = ScriptedMic()
        self._new_connection()
        frames_before = len(self.audio)
        await self.connect(timeout, resume_token=token)
        took = 0.0
        if self.want_audio:
            deadline = self.posted_at + timeout
            while len(self.audio) == frames_before and time.monotonic() < deadline:
                await asyncio.sleep(0.002)
            if len(self.audio) == frames_before:
                raise TimeoutError(f"no audio within {timeout} s of the resume")
            took = self.audio[frames_before][0] - self.posted_at
        self.resumes.append(took)
        return took

    async def keep_connected(self, drop_after_s: float = 2.0, attempts: int = 3) -> None:
        """Resume by itself when the connection drops: no audio for ``drop_after_s`` (the
        server sends a frame every 20 ms, silence too) or a failed connection. Runs until
        cancelled; gives up after ``attempts`` failed resumes in a row."""
        failures = 0
        while failures < attempts:
            await asyncio.sleep(0.2)
            last = self.audio[-1][0] if self.audio else None
            silent = last is not None and time.monotonic() - last > drop_after_s
            if not (silent or self.pc.connectionState == "failed"):
                continue
            log.warning("connection lost; resuming the conversation")
            try:
                await self.resume()
                failures = 0
            except Exception as exc:
                failures += 1
                log.warning("resume failed (%s)", exc)
        log.error("could not resume after %d attempts", attempts)

    def _on_message(self, raw: str | bytes) -> None:
        event = json.loads(raw)
        kind = event.get("type")
        if kind == ("x-avatar.session" if self.ga else "session.created"):
            self.resume_token = event.get("session", {}).get("resume_token")
        if self.ga and kind in ("response.created", "response.done"):
            response_id = event.get("response", {}).get("id")
            if kind == "response.created":
                self.response_id = response_id
            elif response_id == self.response_id:
                self.response_id = None
        if isinstance(event.get("event_id"), str):
            self.last_event_id = event["event_id"]
        self.events.append((time.monotonic(), event))
        self._event_signal.set()
        if self._on_event is not None:
            self._on_event(event)

    async def wait_event(
        self,
        kind: str,
        timeout: float = 10.0,
        where: Callable[[dict[str, Any]], bool] | None = None,
        after: int = 0,
    ) -> dict[str, Any]:
        """The first event of type ``kind`` (index >= ``after``) matching ``where``."""
        deadline = time.monotonic() + timeout
        while True:
            for _, event in self.events[after:]:
                if event.get("type") == kind and (where is None or where(event)):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = [e.get("type") for _, e in self.events]
                raise TimeoutError(f"no {kind!r} event within {timeout} s; saw {seen}")
            self._event_signal.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event_signal.wait(), remaining)

    def _on_track(self, track: MediaStreamTrack) -> None:
        consumer = (
            self._consume_audio(track) if track.kind == "audio" else self._consume_video(track)
        )
        task = asyncio.get_running_loop().create_task(consumer)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _consume_audio(self, track: MediaStreamTrack) -> None:
        async for frame in frames(track):
            assert isinstance(frame, av.AudioFrame)
            data = frame.to_ndarray().reshape(-1)
            channels = len(frame.layout.channels)
            mono = (
                data.reshape(-1, channels).mean(axis=1).astype(np.int16) if channels > 1 else data
            )
            self.audio.append((time.monotonic(), mono.astype(np.int16)))
            self.audio_pts.append(int(frame.pts or 0))

    async def _consume_video(self, track: MediaStreamTrack) -> None:
        async for frame in frames(track):
            self.video_count += 1
            if len(self.video_frames) < self.keep_video_frames and isinstance(frame, av.VideoFrame):
                self.video_frames.append((time.monotonic(), frame))

    def received_audio(self) -> PCM:
        if not self.audio:
            return np.zeros(0, np.int16)
        return np.concatenate([pcm for _, pcm in self.audio])

    async def close(self, delete: bool = True) -> None:
        """Hang up: DELETE the session's resource first (else the server keeps the
        conversation for a resume until its window passes)."""
        location = self.location or (self.session_id and f"/whip/{self.session_id}")
        if delete and location:
            url = f"{self.base_url}{location}"
            with contextlib.suppress(aiohttp.ClientError):
                async with aiohttp.ClientSession() as http, http.delete(url) as resp:
                    await resp.read()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.mic.stop()
        await self.pc.close()


def ice_configuration(
    urls: list[str], username: str | None, credential: str | None, relay_only: bool
) -> RTCConfiguration:
    """STUN/TURN servers for the client; ``relay_only``: gather and use TURN relay candidates
    only (the ICE transport policy "relay"), as a client behind a strict firewall would."""
    if relay_only and not any(url.startswith(TURN_SCHEMES) for url in urls):
        raise ValueError("--relay-only needs a TURN server (--ice-server turn:HOST:PORT)")
    servers = [IceServer(tuple(urls), username, credential)] if urls else []
    return rtc_configuration(servers, relay_only)


def show_event(event: dict[str, Any]) -> None:
    """Every event as a JSON line on stdout; a paused or resumed reply also as a log line."""
    print(json.dumps(event), flush=True)
    kind = str(event.get("type", ""))
    if kind.endswith("output_audio_buffer.paused"):
        log.info("reply paused at %.0f ms of its audio: hearing you", event.get("audio_end_ms", 0))
    elif kind.endswith("output_audio_buffer.resumed"):
        paused, reason = event.get("paused_ms", 0), event.get("reason", "")
        log.info("reply resumed after a %.0f ms pause (%s)", paused, reason)


async def run(args: argparse.Namespace, configuration: RTCConfiguration) -> int:
    if args.pin_host:
        pin_host_addresses(args.pin_host)
    mic = ScriptedMic()
    peer = ClientPeer(
        args.url,
        whip=args.whip,
        video=not args.no_video,
        audio=not args.no_audio,
        mic=mic,
        on_event=show_event,
        configuration=configuration,
        events_label=GA_EVENTS,
    )
    peer.keep_video_frames = 10_000 if args.record_video else 0
    keeper = None
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C or a kill still hang up
        loop.add_signal_handler(signum, stopped.set)
    try:
        started = time.monotonic()
        await peer.connect()
        took_ms = (time.monotonic() - started) * 1000
        log.info("connected in %.0f ms (session %s)", took_ms, peer.session_id)
        if args.wav:
            mic.play(load_wav(args.wav))
        if args.text:
            peer.say(args.text)
        if not args.no_resume and not args.no_audio:
            keeper = loop.create_task(peer.keep_connected())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), args.duration)
        if stopped.is_set():
            log.info("stopped: hanging up")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        await peer.close()  # DELETE first: the server frees the conversation at once
    if args.record_audio:
        save_wav(args.record_audio, peer.received_audio())
        log.info("wrote %s", args.record_audio)
    if args.record_video and peer.video_frames:
        with av.open(str(args.record_video), "w") as container:
            stream = container.add_stream("mpeg4", rate=25)
            first = peer.video_frames[0][1]
            stream.width, stream.height = first.width, first.height
            stream.pix_fmt = "yuv420p"
            for index, (_, frame) in enumerate(peer.video_frames):
                picture = frame.reformat(format="yuv420p")
                picture.pts, picture.time_base = index, Fraction(1, 25)
                for packet in stream.encode(picture):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        log.info("wrote %s (%d frames)", args.record_video, len(peer.video_frames))
    log.info(
        "received %.1f s of audio, %d video frames",
        len(peer.received_audio()) / MEDIA_RATE_HZ,
        peer.video_count,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m client", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    parser.add_argument("--whip", action="store_true", help="connect with WHIP instead of /offer")
    parser.add_argument(
        "--no-resume",
        action="store_true",
        help="do not resume the conversation by itself when the connection drops",
    )
    parser.add_argument("--wav", type=Path, help="16-bit WAV to send as the microphone")
    parser.add_argument("--text", help="send this typed message after connecting")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds to stay connected")
    parser.add_argument("--no-video", action="store_true", help="do not ask for the video track")
    parser.add_argument(
        "--no-audio", action="store_true", help="offer no audio at all: events and typed text only"
    )
    parser.add_argument("--record-audio", type=Path, help="write received audio to this WAV")
    parser.add_argument("--record-video", type=Path, help="write received video to this MP4")
    parser.add_argument(
        "--pin-host",
        action="append",
        default=[],
        metavar="ADDR",
        help="offer only this host address as ICE candidate (repeatable), e.g. 127.0.0.1",
    )
    parser.add_argument(
        "--ice-server",
        action="append",
        default=[],
        metavar="URL",
        help="STUN/TURN server (repeatable), e.g. turn:turn.example.com:3478?transport=udp",
    )
    parser.add_argument("--ice-username", help="TURN username")
    parser.add_argument("--ice-credential", help="TURN password")
    parser.add_argument(
        "--relay-only", action="store_true", help="use TURN relay candidates only (needs TURN)"
    )
    args = parser.parse_args(argv)
    try:
        configuration = ice_configuration(
            args.ice_server, args.ice_username, args.ice_credential, args.relay_only
        )
    except ValueError as exc:  # --relay-only without a TURN server
        parser.error(str(exc))
    if args.no_audio and (args.wav or args.record_audio):
        parser.error("--no-audio sends and receives no audio: drop --wav and --record-audio")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    return asyncio.run(run(args, configuration))


if __name__ == "__main__":
    sys.exit(main())
