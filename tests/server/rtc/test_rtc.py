"""aiortc settings the project owns, checked on the real code path."""

from __future__ import annotations

import asyncio
import statistics

import aioice.ice
import av
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from client.cli import ScriptedMic
from models.tts import OnnxVoiceTts
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
    tune_audio_receive,
)
from server.rtc.speech_encoder import SpeechEncoder
from tests.support.browser_mic import encode_mic_as_browsers_do
from tests.support.lossy_audio import Heard, LossySender, aiortc_buffer, hear_over_loss
from tests.support.server_process import metric_value

LOST_PACKET = 40  # the client's 40th RTP packet (0.8 s in) never arrives


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
        assert "useinbandfec=1" in answer.sdp  # the sender is asked for FEC copies
        receivers = [t.receiver for t in peer.pc.getTransceivers() if t.kind == "audio"]
        assert [type(audio_jitter_buffer(r)) for r in receivers] == [ArrivalBuffer]
        (sender,) = [t.sender for t in peer.pc.getTransceivers() if t.kind == "audio"]
        encoder = sender._RTCRtpSender__encoder  # type: ignore[attr-defined]
        assert isinstance(encoder, SpeechEncoder) and not encoder.fec  # aiortc's offer: no FEC
    finally:
        await peer.close()
        await conversation.close()
        await client.close()


async def test_lost_packets_are_recovered_from_fec_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client speaking as browsers send (mono speech, in-band FEC) loses every tenth packet
    while it speaks: the server's conversation hears every 20 ms, none as silence, and
    /metrics counts each lost frame by how it was made, some from the copy in the next
    packet."""
    pin_host_addresses(["127.0.0.1"])
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic = ScriptedMic()
    mic.play(OnnxVoiceTts().synthesize("What is the capital of France? Tell me a story.").pcm)
    sender = client.addTrack(mic)
    encode_mic_as_browsers_do(sender)
    client.createDataChannel("events")
    await client.setLocalDescription(await client.createOffer())
    detector = TurnDetector(WebRtcGate(2), SileroVad(), VadConfig())
    metrics = Metrics()
    conversation = Conversation("p" * 32, Config(), detector, None, metrics)
    heard: list[int] = []  # the samples of each frame heard
    hear = conversation.hear

    async def hearing(frame: av.AudioFrame, arrival_ms: float) -> None:
        heard.append(frame.samples)
        await hear(frame, arrival_ms)

    monkeypatch.setattr(conversation, "hear", hearing)
    peer = PeerSession(conversation, Config(), lambda _peer, _why: None)
    lost = range(20, 141, 10)  # within the speech (about 3 s: 150 packets)
    try:
        answer = await peer.answer(client.localDescription.sdp)
        await client.setRemoteDescription(answer)
        LossySender(sender, lambda n: n in lost, frozenset())
        for _ in range(500):  # 5 s at most
            if len(heard) > lost[-1] + 10:
                break
            await asyncio.sleep(0.01)
        assert len(heard) > lost[-1] + 10
        text = metrics.render().decode()
        name = "avatar_inbound_audio_lost_seconds_total"
        assert metric_value(text, name) == pytest.approx(0.02 * len(lost))
        assert metric_value(text, name, 'heard_as="recovered"') > 0
        assert metric_value(text, name, 'heard_as="silence"') == 0
        assert peer.inbound_gaps.filled_ms == 0.0
        assert set(heard) == {960}  # each lost packet made one frame
        (receiver,) = [t.receiver for t in peer.pc.getTransceivers() if t.kind == "audio"]
        buffer = audio_jitter_buffer(receiver)
        assert isinstance(buffer, ArrivalBuffer) and buffer.with_copy > 0
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


async def test_a_lost_packet_leaves_the_inbound_audio_as_late_as_before() -> None:
    """After one lost packet the microphone's frames reach the server as soon as before, and
    the lost frame is made by the decoder (no silence put in). With aiortc's buffer (the
    ablation, same path) they come about 280 ms later from then on: it waits until 15 packets
    are held, drops the one before the gap too, then releases one frame per packet that
    arrives, and the two frames are heard as silence."""

    def lost(n: int) -> bool:
        return n == LOST_PACKET

    def later_ms(heard: Heard) -> float:  # after the loss, less before it (medians)
        delays = heard.delays_ms
        return statistics.median(delays[LOST_PACKET + 15 :]) - statistics.median(delays[5:30])

    heard = await hear_over_loss(tune_audio_receive, lost, 120)
    assert later_ms(heard) < 30.0
    assert heard.filled_ms == 0.0
    heard = await hear_over_loss(aiortc_buffer, lost, 120)
    assert later_ms(heard) > 200.0
    assert heard.filled_ms == 40.0
