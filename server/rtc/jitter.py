"""The inbound audio's jitter buffer: each packet handed on as it arrives.

aiortc's ``JitterBuffer`` releases an audio frame once the next packet shows it complete (with
``prefetch`` 1, 20 ms late; aiortc's own 4, 80 ms). After a lost packet it holds everything
until the buffer overflows 15 packets later, drops the packet before the gap too, and then
releases one frame for each packet that arrives: from the first loss to the end of the call,
the user's voice reaches the turn detector about 280 ms late (tests/server/test_rtc.py
measures both). An Opus packet is a whole frame, so this buffer hands each one on at once:
nothing waits, a loss delays nothing after it, and a packet that comes after a newer one
(reordered, or sent twice) is dropped. The track then skips its 20 ms, which the inbound
path fills with silence (server/runtime/inbound.py). Released frames keep their packets'
order, which aiortc's timestamp mapper needs (it takes an older timestamp for a wrap).
"""

from __future__ import annotations

from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket

from server.rtc.opus import has_copy

SEQUENCE_SPAN = 1 << 16  # RTP sequence numbers wrap here
RESTART_BEHIND = 100  # packets: one further behind than this starts a new numbering (aiortc's)


class ArrivalBuffer(JitterBuffer):
    """Audio packets released as they arrive, each one a frame; older ones dropped.
    ``opus_types``: the payload types whose packets are Opus, counted in ``with_copy`` when
    they carry the previous frame's FEC copy (does this sender send them?)."""

    def __init__(self, opus_types: frozenset[int] = frozenset()) -> None:
        super().__init__(capacity=16)  # aiortc's store, left unused: nothing is held
        self._last: int | None = None  # sequence number of the last packet released
        self._opus_types = opus_types
        self.released = 0
        self.dropped = 0  # reordered or repeated packets
        self.with_copy = 0  # released Opus packets that carry a FEC copy

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """The frame of ``packet``, or None for one older than the last released; the flag
        (a picture lost: video only) is always False."""
        seq = packet.sequence_number
        if self._last is not None:
            behind = (self._last - seq) % SEQUENCE_SPAN
            if behind < SEQUENCE_SPAN // 2 and behind <= RESTART_BEHIND:
                self.dropped += 1
                return False, None
        self._last = seq
        self.released += 1
        data: bytes = packet._data  # type: ignore[attr-defined]  # the receiver's depayload
        if packet.payload_type in self._opus_types and has_copy(data):
            self.with_copy += 1
        return False, JitterFrame(data=data, timestamp=packet.timestamp)
