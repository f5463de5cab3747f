"""Bounds on what one peer's SCTP transport holds of inbound data-channel messages.

Written against aiortc 1.16.0 (``aiortc/rtcsctptransport.py``). aiortc keeps every DATA chunk
of a fragmented message in its stream's ``InboundStream.reassembly`` list until the last one
arrives, and ``pop_messages`` rescans that list from the start for each new chunk: a message
of any size is reassembled in full (quadratic in its fragments) before anyone can refuse it.
A 16 MB message, 64 times the ``a=max-message-size`` our SDP advertises (aiortc's
``LOCAL_MAX_MESSAGE_SIZE``, 262,144 bytes), took 18.8 s and stalled the event loop.
aiortc also enforces neither that size nor the receive window it advertises (1 MiB): a sender
that leaves holes in its TSNs makes it hold everything after them.

:func:`bound_inbound_messages` wraps ``_receive_data_chunk`` of one connection's transport (an
instance attribute, nothing global) and looks at each new chunk before aiortc does:

- a message whose fragments held so far exceed the advertised size (or number more than that
  size in fragments of MIN_FRAGMENT_BYTES) is dropped as they arrive: its held fragments are
  released, and it and its later fragments become empty messages of PPID 0 (unspecified; aiortc's
  ``_data_channel_receive`` ignores it), so aiortc still acknowledges every TSN and, for an
  ordered message, hands its stream sequence number on; the first drop of a session is logged
  (sizes only), and the OVERSIZED_BEFORE_CLOSE-th closes the peer;
- a peer that makes the transport hold more than its receive window plus one message, or more
  than MAX_HELD_CHUNKS chunks (held for reassembly or out of TSN order), is closed at once.

Legitimate peers never meet either: browsers refuse to send past ``a=max-message-size`` and
keep within the receive window. Fragments of a dropped message that arrive after a later
message on their stream began are held as aiortc holds any stray fragment (an ordered one at
the head of its stream stalls that stream): the held bounds still apply to them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from aiortc import RTCPeerConnection
from aiortc.rtcsctptransport import (
    SCTP_DATA_FIRST_FRAG,
    SCTP_DATA_LAST_FRAG,
    SCTP_DATA_UNORDERED,
    DataChunk,
    InboundStream,
    RTCSctpTransport,
    tsn_minus_one,
    tsn_plus_one,
)
from aiortc.utils import uint32_gt, uint32_gte

log = logging.getLogger(__name__)

DROPPED_PPID = 0  # RFC 9260 "unspecified": no data channel message; aiortc ignores it
MIN_FRAGMENT_BYTES = 256  # senders fragment at their path MTU (~1,100-1,200 bytes)
MAX_HELD_CHUNKS = 4096  # chunks a transport holds; a recount finding half of it closes the peer
OVERSIZED_BEFORE_CLOSE = 3  # the third message past the advertised size closes the peer


@dataclass(frozen=True)
class InboundBounds:
    """What one SCTP transport may hold of inbound data (bytes are user data)."""

    max_message_bytes: int  # the advertised a=max-message-size; a message past it is dropped
    max_fragments: int  # fragments of one message; past it, dropped too
    max_held_bytes: int  # held over all streams; past it the peer is closed
    max_held_chunks: int  # held over all streams, or out of TSN order; past it, closed
    oversized_before_close: int  # the n-th dropped message closes the peer

    @classmethod
    def of(cls, sctp: RTCSctpTransport) -> InboundBounds:
        """The bounds for ``sctp`` from what it advertises: its max-message-size and its
        receive window (read before any data arrived)."""
        limit = sctp.getCapabilities().maxMessageSize
        return cls(
            max_message_bytes=limit,
            max_fragments=math.ceil(limit / MIN_FRAGMENT_BYTES),
            max_held_bytes=sctp._advertised_rwnd + limit,
            max_held_chunks=MAX_HELD_CHUNKS,
            oversized_before_close=OVERSIZED_BEFORE_CLOSE,
        )


@dataclass(frozen=True)
class Dropping:
    """A message being dropped on one stream: the fragments still to come are dropped too."""

    ordered: bool
    ssn: int  # its stream sequence number (ordered messages)
    lowest_tsn: int  # of its fragments seen so far
    last_tsn: int | None  # of its last fragment, once seen
    handed_on: bool  # its first fragment was seen: the ssn went on as an empty message

    def takes(self, chunk: DataChunk) -> bool:
        """Whether ``chunk`` (on the same stream) is one of this message's fragments."""
        if self.ordered != (not chunk.flags & SCTP_DATA_UNORDERED):
            return False
        if self.ordered:
            return bool(chunk.stream_seq == self.ssn)
        return bool(
            not chunk.flags & SCTP_DATA_FIRST_FRAG
            and uint32_gt(chunk.tsn, self.lowest_tsn)
            and (self.last_tsn is None or uint32_gte(self.last_tsn, chunk.tsn))
        )


def _empty(chunk: DataChunk, ordered: bool) -> None:
    """Make ``chunk`` a whole empty message of DROPPED_PPID (ordered: it keeps its ssn)."""
    chunk.flags = (
        SCTP_DATA_FIRST_FRAG | SCTP_DATA_LAST_FRAG | (0 if ordered else SCTP_DATA_UNORDERED)
    )
    chunk.protocol = DROPPED_PPID
    chunk.user_data = b""


def _insertion(held: list[DataChunk], tsn: int) -> int:
    """Where a chunk of ``tsn`` goes in a stream's reassembly list (sorted by TSN); from the
    end, where an in-order chunk goes."""
    pos = len(held)
    while pos > 0 and uint32_gt(held[pos - 1].tsn, tsn):
        pos -= 1
    return pos


def message_span(held: list[DataChunk], chunk: DataChunk) -> tuple[int, int, int]:
    """The held fragments of ``chunk``'s message, as far as they run in consecutive TSNs on
    either side of it (back to a first fragment, on to a last one): ``held[lo:hi]``, with
    ``(lo, hi, bytes)``; ``chunk`` goes at index ``lo <= pos <= hi`` between them."""
    pos = _insertion(held, chunk.tsn)
    lo, hi = pos, pos
    if not chunk.flags & SCTP_DATA_FIRST_FRAG:
        expected = tsn_minus_one(chunk.tsn)
        while (
            lo > 0 and held[lo - 1].tsn == expected and not held[lo - 1].flags & SCTP_DATA_LAST_FRAG
        ):
            lo -= 1
            if held[lo].flags & SCTP_DATA_FIRST_FRAG:
                break
            expected = tsn_minus_one(expected)
    if not chunk.flags & SCTP_DATA_LAST_FRAG:
        expected = tsn_plus_one(chunk.tsn)
        while (
            hi < len(held)
            and held[hi].tsn == expected
            and not held[hi].flags & SCTP_DATA_FIRST_FRAG
        ):
            hi += 1
            if held[hi - 1].flags & SCTP_DATA_LAST_FRAG:
                break
            expected = tsn_plus_one(expected)
    return lo, hi, sum(len(c.user_data) for c in held[lo:hi])


class InboundGuard:
    """The bounds of one SCTP transport, and what they did (counts)."""

    def __init__(
        self,
        sctp: RTCSctpTransport,
        bounds: InboundBounds,
        name: str,
        on_abuse: Callable[[], None],
    ) -> None:
        """``name``: the session, for the log; ``on_abuse``: closes the peer (called once)."""
        self.bounds = bounds
        self.dropped_messages = 0  # messages past the advertised size
        self.dropped_bytes = 0  # their held fragments released
        self.abuse: str | None = None  # why the peer is being closed
        self._sctp = sctp
        self._name = name
        self._on_abuse = on_abuse
        self._window = sctp._advertised_rwnd  # aiortc's receive window before any data
        self._dropping: dict[int, Dropping] = {}  # stream id ->
        self._held_at_most = 0  # chunks held, an upper bound (recounted when past the bound)
        self._receive: Callable[[DataChunk], Awaitable[None]] = sctp._receive_data_chunk

    def held_bytes(self) -> int:
        """User data the transport holds now (reassembly, out of order), from aiortc's
        advertised receive window."""
        return self._window - self._sctp._advertised_rwnd

    def held_chunks(self) -> int:
        """Chunks the transport holds now for reassembly (counted)."""
        return sum(len(s.reassembly) for s in self._sctp._inbound_streams.values())

    async def receive_data_chunk(self, chunk: DataChunk) -> None:
        """aiortc's step for a DATA chunk, after the bounds have looked at it."""
        if self.abuse is not None:
            return  # the peer is being closed: nothing more is held or acknowledged
        sctp = self._sctp
        received = sctp._last_received_tsn  # set when the association was made
        duplicate = chunk.tsn in sctp._sack_misordered or (
            received is not None and uint32_gte(received, chunk.tsn)
        )
        if not duplicate:  # aiortc only counts a duplicate
            self._bound(chunk)
            self._held_at_most += 1
        await self._receive(chunk)
        self._settle(chunk.stream_id)
        self._check_held()

    def _bound(self, chunk: DataChunk) -> None:
        stream = self._sctp._inbound_streams.get(chunk.stream_id)
        held = [] if stream is None else stream.reassembly
        dropping = self._dropping.get(chunk.stream_id)
        if dropping is not None:
            if dropping.takes(chunk):
                self._release(stream, held, chunk, dropping)
                return
            if chunk.flags & SCTP_DATA_FIRST_FRAG and uint32_gt(chunk.tsn, dropping.lowest_tsn):
                # a later message began: the dropped one's fragments all come before it
                end = tsn_minus_one(chunk.tsn)
                if dropping.last_tsn is None or uint32_gt(dropping.last_tsn, end):
                    self._dropping[chunk.stream_id] = replace(dropping, last_tsn=end)
        lo, hi, size = message_span(held, chunk)
        size += len(chunk.user_data)
        if size <= self.bounds.max_message_bytes and hi - lo < self.bounds.max_fragments:
            return
        dropping = Dropping(
            ordered=not chunk.flags & SCTP_DATA_UNORDERED,
            ssn=chunk.stream_seq,
            lowest_tsn=chunk.tsn,
            last_tsn=None,
            handed_on=False,
        )
        self._release(stream, held, chunk, dropping)
        self.dropped_messages += 1
        if self.dropped_messages == 1:
            log.warning(
                "%s: dropped a data channel message past the advertised max-message-size "
                "(%d bytes of it held when refused, limit %d) as its fragments arrived; the "
                "%d. such message closes the peer (further drops are not logged)",
                self._name,
                size,
                self.bounds.max_message_bytes,
                self.bounds.oversized_before_close,
            )
        if self.dropped_messages >= self.bounds.oversized_before_close:
            self._abused(f"{self.dropped_messages} messages past the max-message-size")

    def _release(
        self,
        stream: InboundStream | None,
        held: list[DataChunk],
        chunk: DataChunk,
        dropping: Dropping,
    ) -> None:
        """Drop ``chunk``, a fragment of the message ``dropping``, and the held fragments it
        runs on from (their bytes are released). The message's first fragment, once seen,
        becomes an empty message that hands its stream sequence number on; every other
        fragment becomes an empty unordered one, which aiortc acknowledges and passes by."""
        flags, tsn = chunk.flags, chunk.tsn
        lo, hi, size = message_span(held, chunk)
        run = held[lo:hi]
        first: DataChunk | None = None
        if run and run[0].flags & SCTP_DATA_FIRST_FRAG:
            first = run[0]  # held: it stays, emptied, where it is
        elif flags & SCTP_DATA_FIRST_FRAG:
            first = chunk
        last_tsn = dropping.last_tsn
        if run and run[-1].flags & SCTP_DATA_LAST_FRAG and uint32_gt(run[-1].tsn, tsn):
            last_tsn = run[-1].tsn
        elif flags & SCTP_DATA_LAST_FRAG:
            last_tsn = tsn
        lowest = dropping.lowest_tsn
        for candidate in (run[0].tsn if run else tsn, tsn):
            if uint32_gt(lowest, candidate):
                lowest = candidate
        if stream is not None and run:
            kept = [first] if first is not None and first is run[0] else []
            stream.reassembly = held[:lo] + kept + held[hi:]
            self._sctp._advertised_rwnd += size
            self.dropped_bytes += size
        handed_on = dropping.handed_on
        if first is not None:
            _empty(first, ordered=dropping.ordered and not handed_on)
            handed_on = True
        if first is not chunk:
            _empty(chunk, ordered=False)
        self._dropping[chunk.stream_id] = replace(
            dropping, lowest_tsn=lowest, last_tsn=last_tsn, handed_on=handed_on
        )

    def _settle(self, stream_id: int) -> None:
        """Forget a dropped message once every TSN up to its last fragment has arrived."""
        dropping = self._dropping.get(stream_id)
        last_tsn = None if dropping is None else dropping.last_tsn
        received = self._sctp._last_received_tsn
        if last_tsn is not None and received is not None and uint32_gte(received, last_tsn):
            del self._dropping[stream_id]

    def _check_held(self) -> None:
        """Close a peer that makes the transport hold more than it advertised it would."""
        bounds, sctp = self.bounds, self._sctp
        if self.held_bytes() > bounds.max_held_bytes:
            self._abused(f"data past its receive window: {self.held_bytes()} bytes held")
        elif len(sctp._sack_misordered) > bounds.max_held_chunks:
            self._abused(f"{len(sctp._sack_misordered)} chunks out of TSN order")
        elif self._held_at_most > bounds.max_held_chunks:
            self._held_at_most = held = self.held_chunks()  # at most half: next recount later
            if held > bounds.max_held_chunks // 2:
                self._abused(f"{held} chunks held for reassembly")

    def _abused(self, why: str) -> None:
        if self.abuse is not None:
            return
        self.abuse = why
        log.warning("%s: closing the peer: it sent %s", self._name, why)
        self._on_abuse()


def bound_inbound_messages(
    pc: RTCPeerConnection, name: str, on_abuse: Callable[[], None]
) -> InboundGuard | None:
    """Bound what ``pc``'s SCTP transport holds of inbound data-channel messages (see the
    module); call after setRemoteDescription, before any data arrives. ``name``: the session,
    for the log; ``on_abuse``: closes the peer (called at most once). None when the offer had
    no data channel. Idempotent."""
    sctp = pc.sctp
    if sctp is None:
        return None
    guard: InboundGuard | None = getattr(sctp, "_avatar_inbound_guard", None)
    if guard is None:
        guard = InboundGuard(sctp, InboundBounds.of(sctp), name, on_abuse)
        sctp._receive_data_chunk = guard.receive_data_chunk  # type: ignore[method-assign]
        sctp._avatar_inbound_guard = guard  # type: ignore[attr-defined]
    return guard
