"""Opus for one voice: mono speech at 32 kbps, with in-band FEC where the receiver asked.

aiortc encodes every audio track as stereo at 96 kbps, which Opus codes as music (CELT
only; about 100 kbps on the voice, benchmarks/audio_loss_bench.py) and protects with nothing.
Browsers send a microphone as mono speech (Opus's hybrid mode: SILK for the voice, about 32
kbps) and, where the receiver's ``a=fmtp`` says ``useinbandfec=1``, put a low-bitrate copy of
each frame's voice into the next packet, from which the receiver recovers a lost packet
(server/rtc/opus.py). The avatar's voice goes out the same way: a third of the bandwidth, and
a browser on a lossy link recovers what it lost instead of extrapolating it.
"""

from __future__ import annotations

import fractions
from typing import Any

from aiortc import RTCPeerConnection
from aiortc.codecs.base import Encoder
from aiortc.mediastreams import convert_timebase
from aiortc.sdp import SessionDescription
from av import AudioFrame, AudioResampler, CodecContext
from av.frame import Frame
from av.packet import Packet

from server.rtc.opus import FEC_PARAMETER

RATE_HZ = 48_000
FRAME_SAMPLES = 960  # 20 ms
TIME_BASE = fractions.Fraction(1, RATE_HZ)
BITRATE_BPS = 32_000
FEC_LOSS_PERCENT = 10  # the loss the FEC copies are sized for (libopus's packet_loss)


class SpeechEncoder(Encoder):
    """Opus for speech: mono, 20 ms frames, ``voip`` mode; ``fec``: in-band FEC copies."""

    def __init__(self, *, fec: bool) -> None:
        self.fec = fec
        self.codec = CodecContext.create("libopus", "w")
        self.codec.bit_rate = BITRATE_BPS
        self.codec.format = "s16"
        self.codec.layout = "mono"
        self.codec.sample_rate = RATE_HZ
        self.codec.time_base = TIME_BASE
        options = {"application": "voip", "vbr": "constrained"}  # libopus's own default
        if fec:
            options |= {"fec": "1", "packet_loss": str(FEC_LOSS_PERCENT)}
        self.codec.options = options
        self.resampler = AudioResampler(
            format="s16", layout="mono", rate=RATE_HZ, frame_size=FRAME_SAMPLES
        )
        self._first_pts: int | None = None

    def encode(self, frame: Frame, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        """The packets of ``frame`` (any rate and layout), and the first one's RTP timestamp
        (samples at 48 kHz from the first packet, as aiortc's encoder counts them)."""
        assert isinstance(frame, AudioFrame)
        packets: list[Packet[Any]] = []
        for resampled in self.resampler.resample(frame):
            packets += self.codec.encode(resampled)
        if not packets:
            return [], 0  # the encoder holds its look-ahead: nothing to send yet
        assert packets[0].pts is not None
        if self._first_pts is None:
            self._first_pts = packets[0].pts
        return [bytes(p) for p in packets], packets[0].pts - self._first_pts

    def pack(self, packet: Packet[Any]) -> tuple[list[bytes], int]:
        """An already encoded packet as RTP payloads and its timestamp."""
        assert packet.pts is not None and packet.time_base is not None
        return [bytes(packet)], convert_timebase(packet.pts, packet.time_base, TIME_BASE)


def asks_for_fec(sdp: str) -> bool:
    """Whether a description's Opus ``a=fmtp`` says ``useinbandfec=1`` (its author decodes
    FEC copies: every browser's offer does)."""
    codecs = (c for m in SessionDescription.parse(sdp).media for c in m.rtp.codecs)
    return any(
        c.mimeType.lower() == "audio/opus" and c.parameters.get(FEC_PARAMETER) == 1 for c in codecs
    )


def speak_as_speech(pc: RTCPeerConnection) -> int:
    """Give each audio sender with a track a :class:`SpeechEncoder`, with FEC copies where the
    remote description asks for them; call after the answer is set, before media flows
    (aiortc creates its own encoder at the first frame and has no option to choose it).
    Returns how many senders were given one."""
    remote = pc.remoteDescription
    fec = remote is not None and asks_for_fec(remote.sdp)
    given = 0
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio" and transceiver.sender.track is not None:
            encoder = SpeechEncoder(fec=fec)
            transceiver.sender._RTCRtpSender__encoder = encoder  # type: ignore[attr-defined]
            given += 1
    return given
