"""VP8 for the avatar: a drawn face, not a camera's picture.

aiortc encodes every video track as a camera's: libvpx's temporal denoiser on
(``noise-sensitivity`` 4) at real-time speed -6. A drawn face has no sensor noise: the
denoiser only blurs it, and costs about a quarter of the encoding. Here it is off, at speed
-12 (libvpx's real-time speeds run to -16, faster with the magnitude). On the avatar's frames
(512x512 at 500 kbps, one thread) that took libvpx from 1.8 to 1.1 ms a frame and the decoded
picture's luma PSNR from 50.4 to 52.9 dB, at the same bitrate (benchmarks/avatar_bench.py
measures the whole way out). Everything else is aiortc's: constant bitrate at the target the
sender adapts from the receiver's reports, no frame lag, one partition, its packetization and
picture ids.
"""

from __future__ import annotations

import multiprocessing

import av
from aiortc.codecs.vpx import Vp8Encoder, number_of_threads
from av.frame import Frame
from av.video.codeccontext import VideoCodecContext

DENOISE = "0"  # libvpx's noise-sensitivity: off (aiortc: 4)
SPEED = "-12"  # libvpx's cpu-used for real time: faster with the magnitude (aiortc: -6)
GOP_FRAMES = 3000  # a keyframe only when asked for (a receiver's PLI) or at this distance
Q_RANGE = (2, 56)  # libvpx's quantiser bounds
REBUILD_SHARE = 0.1  # a target bitrate this far (share) from the codec's rebuilds it


class FaceEncoder(Vp8Encoder):
    """aiortc's VP8 encoder with the codec settings of a drawn picture."""

    def __init__(self) -> None:
        super().__init__()
        self.built: list[VideoCodecContext] = []  # the codecs it made, the last one in use

    def encode(self, frame: Frame, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        """As aiortc's, on a codec of :func:`face_codec` (built again, as aiortc does, when
        the frame's size changes or the target bitrate moves by over ``REBUILD_SHARE``)."""
        assert isinstance(frame, av.VideoFrame)
        codec, bitrate = self.codec, self.target_bitrate
        if codec is not None and (
            (frame.width, frame.height) != (codec.width, codec.height)
            or abs(bitrate - (codec.bit_rate or 0)) > REBUILD_SHARE * (codec.bit_rate or 0)
        ):
            self.codec = None
        if self.codec is None:
            self.codec = face_codec(frame.width, frame.height, bitrate)
            self.built = [*self.built[-1:], self.codec]
        return super().encode(frame, force_keyframe)


def face_codec(width: int, height: int, bitrate: int) -> VideoCodecContext:
    """A libvpx VP8 codec (not yet opened) for ``width`` x ``height`` pixels at ``bitrate``
    (bits/s, constant)."""
    codec = av.CodecContext.create("libvpx", "w")
    assert isinstance(codec, VideoCodecContext)
    codec.width, codec.height = width, height
    codec.bit_rate = bitrate
    codec.pix_fmt = "yuv420p"
    codec.gop_size = GOP_FRAMES
    codec.qmin, codec.qmax = Q_RANGE
    rate = str(bitrate)
    codec.options = {
        "bufsize": rate,  # a second's worth: FFmpeg's rc_buf_sz = bufsize * 1000 / bit_rate ms
        "minrate": rate,  # min = max = target: constant bitrate
        "maxrate": rate,
        "cpu-used": SPEED,
        "deadline": "realtime",
        "lag-in-frames": "0",
        "noise-sensitivity": DENOISE,
        "overshoot-pct": "15",
        "undershoot-pct": "100",
        "partitions": "0",  # one token partition
        "static-thresh": "1",
    }
    codec.thread_count = number_of_threads(width * height, multiprocessing.cpu_count())
    return codec
