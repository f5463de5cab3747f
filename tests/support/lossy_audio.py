"""Two aiortc peers on loopback, the client's microphone losing or reordering packets as told:
how late each of its frames reaches the server's track (tests/server/rtc/test_rtc.py,
benchmarks/jitter_bench.py)."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver, RTCRtpSender
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import AudioStreamTrack, MediaStreamTrack

from server.rtc.inbound import Gaps
from server.rtc.opus import Concealed
from server.rtc.settings import pin_host_addresses

Tune = Callable[[RTCPeerConnection], object]  # sets the server's jitter buffer
Lose = Callable[[int], bool]  # the client's nth RTP packet (1-based) -> whether it is lost


@dataclass(frozen=True)
class Heard:
    """What the server's track gave: each frame's delay from its packet's sending to its
    arrival at the track (ms, in order), the silence the inbound path would put in for
    frames that skipped (ms), and the frames the decoder made for lost packets (ms)."""

    delays_ms: list[float]
    filled_ms: float
    concealed_ms: float


def aiortc_buffer(server: RTCPeerConnection) -> None:
    """aiortc's own buffer, releasing after one packet (the server's before ArrivalBuffer)."""
    for receiver in (t.receiver for t in server.getTransceivers() if t.kind == "audio"):
        assert isinstance(receiver, RTCRtpReceiver)
        buffer = JitterBuffer(capacity=16, prefetch=1)
        receiver._RTCRtpReceiver__jitter_buffer = buffer  # type: ignore[attr-defined]


def _is_rtp(data: bytes) -> bool:
    return not 192 <= data[1] <= 223  # RTCP's packet types are 192-223


class LossySender:
    """A sender's RTP packets (its own SSRC: a bundled transport carries the other tracks'
    too), some lost (``lose``), some sent after the packet that follows them (``late``:
    numbers, 1-based); ``sent_at``: each sent packet's media time (samples after the first
    packet's) -> when it went (monotonic s)."""

    def __init__(self, sender: RTCRtpSender, lose: Lose, late: frozenset[int]) -> None:
        self.sent_at: dict[int, float] = {}
        self._ssrc = sender._ssrc
        self._lose, self._late = lose, late
        self._first: int | None = None
        self._held: list[bytes] = []
        self._count = 0
        self._transport = sender.transport
        self._send = self._transport._send_rtp
        self._transport._send_rtp = self._lossy  # type: ignore[method-assign]

    async def _lossy(self, data: bytes) -> None:
        if not _is_rtp(data) or struct.unpack_from("!I", data, 8)[0] != self._ssrc:
            await self._send(data)
            return
        self._count += 1
        timestamp = struct.unpack_from("!I", data, 4)[0]
        if self._first is None:
            self._first = timestamp
        if self._lose(self._count):
            return
        self.sent_at[(timestamp - self._first) % (1 << 32)] = time.monotonic()
        if self._count in self._late:
            self._held.append(data)
            return
        await self._send(data)
        while self._held:
            await self._send(self._held.pop())


async def hear_over_loss(
    tune: Tune, lose: Lose, frames: int, late: frozenset[int] = frozenset()
) -> Heard:
    """The client sends 20 ms audio frames in real time; RTP packets ``lose`` picks never
    arrive, and those in ``late`` (numbers, 1-based) are sent after the packet that follows
    them. ``frames`` frames are read from the server's track."""
    pin_host_addresses(["127.0.0.1"])
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    server = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    tracks: asyncio.Queue[MediaStreamTrack] = asyncio.Queue()
    server.on("track", tracks.put_nowait)
    sender = client.addTrack(AudioStreamTrack())
    try:
        await client.setLocalDescription(await client.createOffer())
        await server.setRemoteDescription(client.localDescription)
        tune(server)
        await server.setLocalDescription(await server.createAnswer())
        await client.setRemoteDescription(server.localDescription)
        sent = LossySender(sender, lose, late)
        track = await asyncio.wait_for(tracks.get(), 10)
        delays: list[float] = []
        gaps = Gaps()
        concealed_ms = 0.0
        for _ in range(frames):
            frame = await asyncio.wait_for(track.recv(), 5)
            arrived = time.monotonic()
            assert isinstance(frame, av.AudioFrame) and frame.pts is not None
            gaps.before(frame)
            if isinstance(frame.opaque, Concealed):
                concealed_ms += frame.samples * 1000 / frame.sample_rate
            if frame.pts in sent.sent_at:
                delays.append((arrived - sent.sent_at[frame.pts]) * 1000)
        return Heard(delays, gaps.filled_ms, concealed_ms)
    finally:
        await client.close()
        await server.close()
