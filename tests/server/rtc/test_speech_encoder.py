"""The speech encoder (server/rtc/speech_encoder.py): what it sends, and when with FEC."""

from __future__ import annotations

import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription

from server.rtc.opus import has_copy
from server.rtc.speech_encoder import SpeechEncoder, asks_for_fec, speak_as_speech
from tests.support.browser_mic import encoded

CHROME_AUDIO = (
    "m=audio 9 UDP/TLS/RTP/SAVPF 111 63 9 0\r\n"
    "a=rtpmap:111 opus/48000/2\r\n"
    "a=fmtp:111 minptime=10;useinbandfec=1\r\n"
    "a=rtpmap:63 red/48000/2\r\n"
    "a=fmtp:63 111/111\r\n"
)


def tone(seconds: float) -> np.ndarray:
    """A voiced-sounding signal: 150 Hz and its harmonics (48 kHz mono)."""
    t = np.arange(int(seconds * 48_000)) / 48_000
    wave = np.zeros_like(t)
    for k in range(1, 8):
        wave += np.sin(2 * np.pi * 150 * k * t) / k
    return (wave * 3000).astype(np.int16)


def test_mono_speech_at_about_32_kbps_in_20_ms_packets() -> None:
    sent = encoded(tone(2.0), SpeechEncoder(fec=False))
    assert len(sent) >= 95
    assert [t for _, t in sent[:3]] == [0, 960, 1920]
    for payload, _ in sent:
        assert not payload[0] & 0x4  # mono (a voice: tests/server/rtc/test_opus.py)
        assert payload[0] & 0x3 == 0  # one frame per packet
    kbps = sum(len(p) for p, _ in sent) * 8 / (len(sent) * 0.02) / 1000
    assert 20 < kbps < 40
    assert not any(has_copy(p) for p, _ in sent)  # no FEC asked: no copies


def test_an_offer_that_decodes_fec_is_told_apart() -> None:
    assert asks_for_fec(CHROME_AUDIO)
    assert not asks_for_fec(CHROME_AUDIO.replace("useinbandfec=1", "useinbandfec=0"))
    assert not asks_for_fec(CHROME_AUDIO.replace(";useinbandfec=1", ""))
    # the parameter on another payload type than Opus's says nothing
    assert not asks_for_fec(
        CHROME_AUDIO.replace(";useinbandfec=1", "").replace("111/111", "111/111;useinbandfec=1")
    )


async def test_only_audio_senders_with_a_track_get_the_encoder() -> None:
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="recvonly")
        assert speak_as_speech(pc) == 0  # nothing to send
    finally:
        await pc.close()


async def test_the_encoder_follows_the_remote_offer() -> None:
    """An offer with ``useinbandfec=1`` gets FEC copies; aiortc's own offer (no fmtp) not."""
    from aiortc.mediastreams import AudioStreamTrack

    for asks in (True, False):
        client, server = RTCPeerConnection(), RTCPeerConnection()
        try:
            client.addTransceiver("audio", direction="sendrecv")
            offer = await client.createOffer()
            sdp = offer.sdp
            if asks:
                pt = sdp.split("a=rtpmap:")[1].split(" ")[0]
                sdp = sdp.replace(
                    f"a=rtpmap:{pt} opus/48000/2\r\n",
                    f"a=rtpmap:{pt} opus/48000/2\r\na=fmtp:{pt} useinbandfec=1\r\n",
                )
            await server.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            (transceiver,) = server.getTransceivers()
            transceiver.sender.replaceTrack(AudioStreamTrack())
            transceiver.direction = "sendrecv"
            assert speak_as_speech(server) == 1
            encoder = transceiver.sender._RTCRtpSender__encoder  # type: ignore[attr-defined]
            assert isinstance(encoder, SpeechEncoder) and encoder.fec is asks
        finally:
            await client.close()
            await server.close()
