"""Two aiortc peers on loopback, the client's microphone losing or reordering packets as told:
how late each of its frames reaches the server's track (tests/server/test_rtc.py,
benchmarks/jitter_bench.py)."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import AudioStreamTrack, MediaStreamTrack

from server.rtc.settings import pin_host_addresses
from server.runtime.inbound import Gaps

Tune = Callable[[RTCPeerConnection], object]  # sets the server's jitter buffer
Lose = Callable[[int], bool]  # the client's nth RTP packet (1-based) -> whether it is lost


@dataclass(frozen=True)
class Heard:
    """What the server's track gave: each frame's delay from its packet's sending to its
    arrival at the track (ms, in order), and the silence the inbound path would put in for
    frames that skipped (ms)."""

    delays_ms: list[float]
    filled_ms: float


def aiortc_buffer(server: RTCPeerConnection) -> None:
    """aiortc's own buffer, releasing after one packet (the server's before ArrivalBuffer)."""
    for receiver in (t.receiver for t in server.getTransceivers() if t.kind == "audio"):
        assert isinstance(receiver, RTCRtpReceiver)
        buffer = JitterBuffer(capacity=16, prefetch=1)
        receiver._RTCRtpReceiver__jitter_buffer = buffer  # type: ignore[attr-defined]


def _is_rtp(data: bytes) -> bool:
    return not 192 <= data[1] <= 223  # RTCP's packet types are 192-223


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
        transport = sender.transport
        send = transport._send_rtp
        sent_at: dict[int, float] = {}  # media time (samples from the first) -> sent
        first: list[int] = []
        held: list[bytes] = []
        count = 0

        async def lossy(data: bytes) -> None:
            nonlocal count
            if not _is_rtp(data):
                await send(data)
                return
            count += 1
            timestamp = struct.unpack_from("!I", data, 4)[0]
            first[:] = first or [timestamp]
            if lose(count):
                return
            sent_at[(timestamp - first[0]) % (1 << 32)] = time.monotonic()
            if count in late:
                held.append(data)
                return
            await send(data)
            while held:
                await send(held.pop())

        transport._send_rtp = lossy  # type: ignore[method-assign]
        track = await asyncio.wait_for(tracks.get(), 10)
        delays: list[float] = []
        gaps = Gaps()
        for _ in range(frames):
            frame = await asyncio.wait_for(track.recv(), 5)
            arrived = time.monotonic()
            assert isinstance(frame, av.AudioFrame) and frame.pts is not None
            gaps.before(frame)
            if frame.pts in sent_at:
                delays.append((arrived - sent_at[frame.pts]) * 1000)
        return Heard(delays, gaps.filled_ms)
    finally:
        await client.close()
        await server.close()
