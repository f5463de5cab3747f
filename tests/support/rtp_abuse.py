"""What a hostile client does to its own microphone's RTP packets below aiortc's API: sends
each one many times over as new packets (a flood faster than real time), or moves every
packet's timestamp on by a jump (time skipped between each two packets).

Like tests/support/lossy_audio.py, these wrap the client sender's transport (plain RTP, before
SRTP); only the sender's own SSRC is touched, and the server is untouched.
"""

from __future__ import annotations

import struct
import time

from aiortc import RTCRtpSender

SEQUENCE_SPAN = 1 << 16
TIMESTAMP_SPAN = 1 << 32
OPUS_FRAME_TICKS = 960  # 20 ms at Opus's 48 kHz RTP clock


def _is_rtp(data: bytes) -> bool:
    return len(data) >= 12 and not 192 <= data[1] <= 223  # RTCP's packet types are 192-223


class RewritingSender:
    """The base of the hostile senders: ``sent`` counts the RTP packets that went out of the
    sender's SSRC, ``first_at``/``last_at`` when the first and last of them went
    (``time.monotonic()``)."""

    def __init__(self, sender: RTCRtpSender) -> None:
        self._ssrc = sender._ssrc
        self._transport = sender.transport
        self._send = self._transport._send_rtp
        self._transport._send_rtp = self._rewrite  # type: ignore[method-assign]
        self.active = True
        self.sent = 0
        self.first_at: float | None = None
        self.last_at: float | None = None

    def stop(self) -> None:
        """Send nothing more of this SSRC (its other packets are dropped from now on)."""
        self.active = False

    async def _rewrite(self, data: bytes) -> None:
        if not _is_rtp(data) or struct.unpack_from("!I", data, 8)[0] != self._ssrc:
            await self._send(data)
            return
        if not self.active:
            return
        for packet in self.packets(data):
            self.first_at = self.first_at or time.monotonic()
            await self._send(packet)
            self.sent += 1
        self.last_at = time.monotonic()

    def packets(self, data: bytes) -> list[bytes]:
        """What goes out in place of the sender's packet ``data``."""
        raise NotImplementedError


def with_header(data: bytes, sequence: int, timestamp: int) -> bytes:
    """``data`` (an RTP packet) with its sequence number and timestamp replaced."""
    head = struct.pack("!HI", sequence % SEQUENCE_SPAN, timestamp % TIMESTAMP_SPAN)
    return data[:2] + head + data[8:]


class FloodingSender(RewritingSender):
    """Each 20 ms packet the microphone makes goes out ``copies`` times, as new packets in
    sequence whose timestamps move on 20 ms each: ``copies`` times real time (40: 2,000
    packets a second)."""

    def __init__(self, sender: RTCRtpSender, copies: int) -> None:
        super().__init__(sender)
        self._copies = copies
        self._sequence: int | None = None
        self._timestamp = 0

    def packets(self, data: bytes) -> list[bytes]:
        sequence, timestamp = struct.unpack_from("!HI", data, 2)
        if self._sequence is None:
            self._sequence, self._timestamp = sequence, timestamp
        out = []
        for _ in range(self._copies):
            out.append(with_header(data, self._sequence, self._timestamp))
            self._sequence += 1
            self._timestamp += OPUS_FRAME_TICKS
        return out


class JumpingSender(RewritingSender):
    """Every packet at the microphone's pace (50 a second), but each one's timestamp
    ``jump_ms`` further on than the last's: the receiver sees ``jump_ms`` of audio lost
    between each two packets."""

    def __init__(self, sender: RTCRtpSender, jump_ms: float) -> None:
        super().__init__(sender)
        self._jump = round(jump_ms * 48)
        self._count = 0

    def packets(self, data: bytes) -> list[bytes]:
        sequence, timestamp = struct.unpack_from("!HI", data, 2)
        self._count += 1
        return [with_header(data, sequence, timestamp + self._count * self._jump)]
