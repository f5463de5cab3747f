"""The microphone encoded as browsers send it: Opus mono speech at 32 kbps with in-band FEC.

aiortc's own encoder sends stereo at 96 kbps, which Opus codes as music (CELT only) and
protects with nothing. Chrome, Safari and the mobile SDKs send a microphone as mono speech
(~32 kbps: Opus's hybrid mode, SILK for the voice) and, when the receiver asks for it
(``useinbandfec=1``), put a low-bitrate copy of each frame's voice into the next packet, so
that a receiver recovers a lost packet from the one after it. Tests and benchmarks send the
user's words this way (tests/server/test_rtc.py, benchmarks/mic_loss_bench.py).
"""

from __future__ import annotations

import fractions
from typing import Any

from aiortc import RTCRtpSender
from aiortc.codecs.base import Encoder
from aiortc.mediastreams import convert_timebase
from av import AudioFrame, AudioResampler, CodecContext
from av.frame import Frame
from av.packet import Packet

RATE_HZ = 48_000
FRAME_SAMPLES = 960  # 20 ms
TIME_BASE = fractions.Fraction(1, RATE_HZ)
BITRATE_BPS = 32_000
EXPECTED_LOSS_PERCENT = 10  # how much redundancy the encoder spends on FEC


class MicEncoder(Encoder):
    """Opus for a microphone: mono, 20 ms frames, speech mode; ``fec``: in-band FEC."""

    def __init__(self, *, fec: bool = True) -> None:
        self.codec = CodecContext.create("libopus", "w")
        self.codec.bit_rate = BITRATE_BPS
        self.codec.format = "s16"
        self.codec.layout = "mono"
        self.codec.sample_rate = RATE_HZ
        self.codec.time_base = TIME_BASE
        options = {"application": "voip"}
        if fec:
            options |= {"fec": "1", "packet_loss": str(EXPECTED_LOSS_PERCENT)}
        self.codec.options = options
        self.resampler = AudioResampler(
            format="s16", layout="mono", rate=RATE_HZ, frame_size=FRAME_SAMPLES
        )
        self._first_pts: int | None = None

    def encode(self, frame: Frame, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        """The packets of ``frame`` (any rate and layout), and the first one's RTP timestamp
        (samples at 48 kHz from the first packet)."""
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


def encode_mic_as_browsers_do(sender: RTCRtpSender, *, fec: bool = True) -> None:
    """Give an audio sender :class:`MicEncoder` before its first frame (aiortc creates its
    encoder at the first frame and has no option to choose it)."""
    assert sender.kind == "audio"
    sender._RTCRtpSender__encoder = MicEncoder(fec=fec)  # type: ignore[attr-defined]
