"""aiortc settings the project owns, checked on the real code path."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable

import aioice.ice
import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import AudioStreamTrack, MediaStreamTrack

from models.vad import SileroVad, WebRtcGate
from server.config import Config, TransportConfig, VadConfig
from server.conversation.conversation import Conversation
from server.metrics import Metrics
from server.pipeline.turn_detector import TurnDetector
from server.rtc.ice import ice_servers
from server.rtc.jitter import ArrivalBuffer
from server.rtc.peer import PeerSession
from server.rtc.settings import (
    audio_jitter_buffer,
    pin_host_addresses,
    rtc_configuration,
    tune_audio_jitter,
)
from server.runtime.inbound import Gaps


async def test_server_peer_releases_inbound_audio_packets_as_they_arrive() -> None:
    pin_host_addresses(["127.0.0.1"])
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    client.addTransceiver("audio", direction="sendrecv")
    client.createDataChannel("events")
    await client.setLocalDescription(await client.createOffer())
    detector = TurnDetector(WebRtcGate(2), SileroVad(), VadConfig())
    conversation = Conversation("p" * 32, Config(), detector, None, Metrics())
    peer = PeerSession(conversation, Config(), lambda _peer, _why: None)
    try:
        answer = await peer.answer(client.localDescription.sdp)
        assert "a=candidate" in answer.sdp and "127.0.0.1" in answer.sdp
        receivers = [t.receiver for t in peer.pc.getTransceivers() if t.kind == "audio"]
        assert [type(audio_jitter_buffer(r)) for r in receivers] == [ArrivalBuffer]
    finally:
        await peer.close()
        await conversation.close()
        await client.close()


def test_no_public_stun_by_default_and_configured_servers_otherwise() -> None:
    assert rtc_configuration(ice_servers(TransportConfig(), 0, "server")).iceServers == []
    config = TransportConfig(
        ice_urls=("turn:127.0.0.1:3478",), ice_username="u", ice_credential="p"
    )
    configured = rtc_configuration(ice_servers(config, 0, "server"))
    (server,) = configured.iceServers or []
    assert server.urls == ["turn:127.0.0.1:3478"]
    assert server.username == "u" and server.credential == "p"


def test_host_address_pinning_filters_by_family() -> None:
    pin_host_addresses(["127.0.0.1", "::1"])
    assert aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=False) == ["127.0.0.1"]
    assert aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True) == ["127.0.0.1", "::1"]
    pin_host_addresses([])
    assert "127.0.0.1" not in aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=False)


LOST_PACKET = 40  # the client's 40th RTP packet (0.8 s in) never arrives
FRAMES_HEARD = 120


async def _lateness_after_a_loss(
    tune: Callable[[RTCPeerConnection], object],
) -> tuple[float, float]:
    """Two aiortc peers on loopback; the client sends 20 ms audio frames in real time and
    loses one packet. The server's inbound frames' lateness (arrival minus media time) after
    the loss, less before it (ms, medians), with the server's buffer set by ``tune``; and the
    silence the server's inbound path puts in for the frames that skipped (ms)."""
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
        rtp_sent = 0

        async def lossy(data: bytes) -> None:
            nonlocal rtp_sent
            if not 192 <= data[1] <= 223:  # RTP, not RTCP (packet types 192-223)
                rtp_sent += 1
                if rtp_sent == LOST_PACKET:
                    return
            await send(data)

        transport._send_rtp = lossy  # type: ignore[method-assign]
        track = await asyncio.wait_for(tracks.get(), 10)
        heard: list[tuple[float, float]] = []
        gaps = Gaps()
        for _ in range(FRAMES_HEARD):
            frame = await asyncio.wait_for(track.recv(), 5)
            assert isinstance(frame, av.AudioFrame)
            assert frame.pts is not None and frame.time_base is not None
            heard.append((time.monotonic(), float(frame.pts * frame.time_base)))
            gaps.before(frame)
        late = [(at - media) * 1000 for at, media in heard]
        cut = LOST_PACKET - 5  # frames before the loss: those of packets well before it
        later = statistics.median(late[cut + 20 :]) - statistics.median(late[5:cut])
        return later, gaps.filled_ms
    finally:
        await client.close()
        await server.close()


def _aiortc_buffer(server: RTCPeerConnection) -> None:
    """aiortc's own buffer, releasing after one packet (the server's before ArrivalBuffer)."""
    for receiver in (t.receiver for t in server.getTransceivers() if t.kind == "audio"):
        assert isinstance(receiver, RTCRtpReceiver)
        buffer = JitterBuffer(capacity=16, prefetch=1)
        receiver._RTCRtpReceiver__jitter_buffer = buffer  # type: ignore[attr-defined]


async def test_a_lost_packet_leaves_the_inbound_audio_as_late_as_before() -> None:
    """After one lost packet the microphone's frames reach the server as soon as before. With
    aiortc's buffer (the ablation, same path) they come about 300 ms later from then on: it
    waits until 15 packets are held, then releases one frame per packet that arrives."""
    later, filled_ms = await _lateness_after_a_loss(tune_audio_jitter)
    assert later < 30.0
    assert filled_ms == 20.0  # the lost frame, heard as silence
    later, filled_ms = await _lateness_after_a_loss(_aiortc_buffer)
    assert later > 200.0
    assert filled_ms == 40.0  # it dropped the packet before the gap too
