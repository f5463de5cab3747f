"""The inbound audio's jitter buffer: each packet handed on as it arrives.

aiortc's ``JitterBuffer`` releases an audio frame once the next packet shows it complete (with
``prefetch`` 1, 20 ms late; aiortc's own 4, 80 ms). After a lost packet it holds everything
until the buffer overflows 15 packets later, drops the packet before the gap too, and then
releases one frame for each packet that arrives: from the first loss to the end of the call,
the user's voice reaches the turn detector about 280 ms late (tests/server/rtc/test_rtc.py
measures both). An Opus packet is a whole frame, so this buffer hands each one on at once:
nothing waits, a loss delays nothing after it, and a packet that comes after a newer one
(reordered, or sent twice) is dropped. The track then skips its 20 ms, which the inbound
path fills with silence (server/rtc/inbound.py). Released frames keep their packets'
order, which aiortc's timestamp mapper needs (it takes an older timestamp for a wrap).

With a :class:`MediaGuard` the buffer also keeps the session's inbound audio budget
(server/runtime/budget.py), before anything is decoded: a packet over the packet rate, or
whose audio the budget has no room for, is dropped; a jump in the timestamps that is a
discontinuity (over ``transport.max_media_gap_ms``, or back in time) or that the budget has no
room to fill is joined: the packets after it are handed on with their timestamps moved back
by it, so the decoder conceals nothing and the inbound path fills no silence for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket

from server.clock import Clock
from server.rtc.opus import RATE_HZ, has_copy, packet_samples
from server.runtime.budget import Admission, Heard, MediaBudget

SEQUENCE_SPAN = 1 << 16  # RTP sequence numbers wrap here
TIMESTAMP_SPAN = 1 << 32  # RTP timestamps wrap here
RESTART_BEHIND = 100  # packets: one further behind than this starts a new numbering (aiortc's)


@dataclass(frozen=True)
class PayloadClock:
    """An audio payload type's RTP clock: Opus at 48 kHz (a packet's length read from its TOC
    byte), else G.711 or G.722 at 8 kHz (a byte a tick)."""

    rate_hz: int = RATE_HZ
    opus: bool = True

    def ticks(self, data: bytes) -> int:
        """The clock ticks a packet's payload ``data`` plays."""
        return packet_samples(data) if self.opus else len(data)


@dataclass(frozen=True)
class MediaGuard:
    """A session's inbound audio budget, shared by its audio receivers, and what is done past
    it: ``limited`` counts a packet dropped (``media``) or a gap left unfilled (``jump``);
    ``flooded`` ends the session (once)."""

    budget: MediaBudget
    clock: Clock
    limited: Callable[[str], None]
    flooded: Callable[[], None]


class ArrivalBuffer(JitterBuffer):
    """Audio packets released as they arrive, each one a frame; older ones dropped.
    ``opus_types``: the payload types whose packets are Opus, counted in ``with_copy`` when
    they carry the previous frame's FEC copy (does this sender send them?). ``guard``: the
    session's audio budget (None: none); ``clocks``: each payload type's RTP clock (Opus's
    where not given)."""

    def __init__(
        self,
        opus_types: frozenset[int] = frozenset(),
        guard: MediaGuard | None = None,
        clocks: Mapping[int, PayloadClock] | None = None,
    ) -> None:
        super().__init__(capacity=16)  # aiortc's store, left unused: nothing is held
        self._last: int | None = None  # sequence number of the last packet released
        self._opus_types = opus_types
        self._guard = guard
        self._clocks = dict(clocks or {})
        self._shift = 0  # ticks taken off every timestamp: the gaps joined so far
        self._expected: int | None = None  # where the last released packet's audio ended
        self.released = 0
        self.dropped = 0  # reordered or repeated packets
        self.limited = 0  # packets dropped for the session's budget
        self.joined = 0  # gaps in the timestamps joined, not filled
        self.with_copy = 0  # released Opus packets that carry a FEC copy

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """The frame of ``packet``, or None for one older than the last released or over
        the budget; the flag (a picture lost: video only) is always False."""
        guard = self._guard
        now_ms = 0.0 if guard is None else guard.clock.now_ms()
        if guard is not None and not self._within_rate(guard, now_ms):
            return False, None
        seq = packet.sequence_number
        if self._last is not None:
            behind = (self._last - seq) % SEQUENCE_SPAN
            if behind < SEQUENCE_SPAN // 2 and behind <= RESTART_BEHIND:
                self.dropped += 1
                return False, None
        data: bytes = packet._data  # type: ignore[attr-defined]  # the receiver's depayload
        timestamp = packet.timestamp
        if guard is not None:
            timed = self._timed(guard, now_ms, packet.payload_type, data, timestamp)
            if timed is None:
                return False, None
            timestamp = timed
        self._last = seq
        self.released += 1
        if packet.payload_type in self._opus_types and has_copy(data):
            self.with_copy += 1
        return False, JitterFrame(data=data, timestamp=timestamp)

    def _within_rate(self, guard: MediaGuard, now_ms: float) -> bool:
        """Whether the packet rate lets one more packet in (past it: counted, maybe ended)."""
        admission = guard.budget.packet(now_ms)
        if admission is Admission.TAKE:
            return True
        if admission is Admission.END:
            guard.flooded()
        self.limited += 1
        guard.limited("media")
        return False

    def _timed(
        self, guard: MediaGuard, now_ms: float, payload_type: int, data: bytes, timestamp: int
    ) -> int | None:
        """The timestamp to hand on for a packet (its own, less the gaps joined before it),
        or None: no room for its audio (dropped, counted)."""
        clock = self._clocks.get(payload_type, PayloadClock())
        ticks = clock.ticks(data)
        moved = (timestamp - self._shift) % TIMESTAMP_SPAN
        gap = 0
        if self._expected is not None:
            gap = (moved - self._expected) % TIMESTAMP_SPAN
            gap -= TIMESTAMP_SPAN if gap >= TIMESTAMP_SPAN // 2 else 0
        per_ms = clock.rate_hz / 1000
        heard = guard.budget.audio(now_ms, ticks / per_ms, gap / per_ms)
        if heard is Heard.DROP:
            self.limited += 1
            guard.limited("media")
            return None
        if heard in (Heard.JOIN, Heard.JOIN_LIMITED) and self._expected is not None:
            self._shift = (self._shift + gap) % TIMESTAMP_SPAN
            moved = self._expected
            self.joined += 1
            if heard is Heard.JOIN_LIMITED:
                guard.limited("jump")
        self._expected = (moved + ticks) % TIMESTAMP_SPAN
        return moved
