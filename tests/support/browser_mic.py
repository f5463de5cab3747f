"""The microphone encoded as browsers send it: Opus mono speech at 32 kbps with in-band FEC.

aiortc's own encoder sends stereo at 96 kbps, which Opus codes as music (CELT only) and
protects with nothing. Chrome, Safari and the mobile SDKs send a microphone as mono speech
(~32 kbps: Opus's hybrid mode, SILK for the voice) and, when the receiver asks for it
(``useinbandfec=1``), put a low-bitrate copy of each frame's voice into the next packet, so
that a receiver recovers a lost packet from the one after it: the server's own
:class:`~server.rtc.speech_encoder.SpeechEncoder`. Tests and benchmarks send the user's words
this way (tests/server/rtc/test_rtc.py, benchmarks/audio_loss_bench.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import av
import numpy as np
import numpy.typing as npt
from aiortc import RTCRtpSender
from aiortc.codecs.base import Encoder

from server.rtc.speech_encoder import SpeechEncoder

RATE_HZ = 48_000
FRAME = 960  # samples per 20 ms packet
Packets = list[tuple[bytes, int]]  # (RTP payload, timestamp)


def encode_mic_as_browsers_do(sender: RTCRtpSender, *, fec: bool = True) -> None:
    """Give an audio sender a :class:`SpeechEncoder` before its first frame (aiortc creates
    its encoder at the first frame and has no option to choose it)."""
    assert sender.kind == "audio"
    sender._RTCRtpSender__encoder = SpeechEncoder(fec=fec)  # type: ignore[attr-defined]


def frames(pcm: npt.NDArray[np.int16]) -> Iterator[av.AudioFrame]:
    """``pcm`` (48 kHz mono) as 20 ms frames, as a track gives them (pts in samples)."""
    for start in range(0, len(pcm) - FRAME + 1, FRAME):
        frame = av.AudioFrame.from_ndarray(
            pcm[start : start + FRAME].reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = RATE_HZ
        frame.pts = start
        yield frame


def encoded(pcm: npt.NDArray[np.int16], encoder: Encoder) -> Packets:
    """``pcm`` (48 kHz mono) as ``encoder`` sends it: RTP payloads and their timestamps."""
    packets: Packets = []
    for frame in frames(pcm):
        payloads, timestamp = encoder.encode(frame)
        packets += [(payload, timestamp) for payload in payloads]
    return packets
