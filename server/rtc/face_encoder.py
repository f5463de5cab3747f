"""The avatar's video sender gets the avatar's VP8 encoder (server/avatar/encoder.py)."""

from __future__ import annotations

from aiortc import RTCPeerConnection

from server.avatar.encoder import FaceEncoder


def encode_as_face(pc: RTCPeerConnection) -> int:
    """Give each video sender with a track whose negotiated codec is VP8 a
    :class:`FaceEncoder`; call after the answer is set, before media flows (aiortc creates
    its own encoder at the first frame). Returns how many were given one."""
    given = 0
    for transceiver in pc.getTransceivers():
        codecs = transceiver._codecs  # the negotiated ones, the sender's first
        if transceiver.kind != "video" or transceiver.sender.track is None or not codecs:
            continue
        if codecs[0].mimeType.lower() == "video/vp8":
            transceiver.sender._RTCRtpSender__encoder = FaceEncoder()  # type: ignore[attr-defined]
            given += 1
    return given
