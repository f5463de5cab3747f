"""The avatar's VP8 encoder (server/avatar/encoder.py): a drawn picture's settings, kept when
aiortc's sender changes the bitrate, and given only to VP8 video senders."""

from __future__ import annotations

from dataclasses import replace

import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.codecs.vpx import Vp8Decoder, Vp8Encoder, vp8_depayload
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import VideoStreamTrack

from models.avatar import ProceduralAvatar
from server.avatar.encoder import DENOISE, SPEED, FaceEncoder, face_codec
from server.avatar.seam import Expression, FaceState
from server.avatar.video import YuvConverter
from server.rtc.face_encoder import encode_as_face
from server.runtime.media import VIDEO_TIME_BASE

SIZE = 256


def faces(count: int) -> list[np.ndarray]:
    """The avatar talking, as YUV 4:2:0 planes (each picture a little different)."""
    renderer, to_yuv = ProceduralAvatar(SIZE, SIZE), YuvConverter()
    state = FaceState(renderer.appearances[0], expression=Expression.SPEAKING)
    return [
        to_yuv(renderer.render(replace(state, viseme_weight=k / count, blink=(k % 5) / 4)))
        for k in range(count)
    ]


def frame(yuv: np.ndarray, k: int) -> av.VideoFrame:
    picture = av.VideoFrame.from_ndarray(yuv, format="yuv420p")
    picture.pts, picture.time_base = k * 3600, VIDEO_TIME_BASE
    return picture


def luma_psnr(encoder: Vp8Encoder, pictures: list[np.ndarray]) -> float:
    """The median luma PSNR (dB) of the pictures sent through ``encoder`` (its RTP payloads)
    and decoded as a receiver does."""
    decoder, scores = Vp8Decoder(), []
    for k, yuv in enumerate(pictures):
        payloads, timestamp = encoder.encode(frame(yuv, k))
        data = b"".join(vp8_depayload(p) for p in payloads)
        for out in decoder.decode(JitterFrame(data=data, timestamp=timestamp)):
            assert isinstance(out, av.VideoFrame)
            got = out.to_ndarray(format="yuv420p")[:SIZE].astype(np.float64)
            error = float(np.mean((got - yuv[:SIZE].astype(np.float64)) ** 2))
            scores.append(10 * np.log10(255**2 / max(error, 1e-9)))
    assert len(scores) == len(pictures)
    return float(np.median(scores))


def test_a_drawn_face_is_coded_without_the_denoiser_and_no_worse() -> None:
    pictures = faces(25)
    face, camera = FaceEncoder(), Vp8Encoder()
    face_psnr, camera_psnr = luma_psnr(face, pictures), luma_psnr(camera, pictures)
    assert face.codec is not None and face.built == [face.codec]  # one codec, the face's
    # the denoiser (aiortc's camera setting) only blurs a drawn picture: 50.4 against 52.9 dB
    # at 512x512 (benchmarks/avatar_bench.py)
    assert face_psnr >= camera_psnr - 0.5, (face_psnr, camera_psnr)
    assert face_psnr > 40


def test_the_face_codec_settings() -> None:
    codec = face_codec(SIZE, SIZE, 500_000)
    assert codec.options["noise-sensitivity"] == DENOISE == "0"
    assert codec.options["cpu-used"] == SPEED and codec.options["deadline"] == "realtime"
    assert codec.options["minrate"] == codec.options["maxrate"] == "500000"  # constant
    assert codec.bit_rate == 500_000 and codec.pix_fmt == "yuv420p"


def test_the_settings_outlive_a_bitrate_change_and_a_new_size() -> None:
    """aiortc's sender moves the target bitrate on the receiver's reports; the codec is then
    built again, with the face's settings."""
    encoder = FaceEncoder()
    (yuv,) = faces(1)
    encoder.encode(frame(yuv, 0))
    first = encoder.codec
    encoder.encode(frame(yuv, 1))
    assert encoder.codec is first  # nothing changed: the same codec
    encoder.target_bitrate = 1_000_000  # from 500 kbps
    encoder.encode(frame(yuv, 2), force_keyframe=True)
    assert encoder.codec is not first and encoder.codec is not None
    assert encoder.codec.bit_rate == 1_000_000
    assert encoder.built == [first, encoder.codec]  # built by the face's settings
    smaller = YuvConverter()(np.zeros((SIZE // 2, SIZE // 2, 3), np.uint8))
    payloads, _ = encoder.encode(frame(smaller, 3))
    assert payloads and encoder.codec.width == SIZE // 2
    assert encoder.built[-1] is encoder.codec


async def test_only_a_vp8_video_sender_with_a_track_gets_it() -> None:
    for preferred, given in (("video/VP8", 1), ("video/H264", 0)):
        client, server = RTCPeerConnection(), RTCPeerConnection()
        try:
            client.addTransceiver("video", direction="sendrecv")
            client.addTransceiver("audio", direction="sendrecv")
            offer = await client.createOffer()
            await server.setRemoteDescription(RTCSessionDescription(offer.sdp, "offer"))
            video = next(t for t in server.getTransceivers() if t.kind == "video")
            assert encode_as_face(server) == 0  # no track to send yet
            video.sender.replaceTrack(VideoStreamTrack())
            video.direction = "sendrecv"
            video._codecs = sorted(video._codecs, key=lambda c: c.mimeType != preferred)
            assert encode_as_face(server) == given
            encoder = video.sender._RTCRtpSender__encoder  # type: ignore[attr-defined]
            assert isinstance(encoder, FaceEncoder) is bool(given)
        finally:
            await client.close()
            await server.close()
