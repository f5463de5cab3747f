"""Which conversations waiting for a resume must end to keep their bound (I/O-free).

A conversation whose connection was lost waits ``session.resume_window_s`` for its client to
come back. It uses no media or model time while it waits, so it does not count against
``transport.max_sessions``; what it holds is memory (its history, its unplayed speech, the
events kept for the client). The waiting ones have a bound of their own: a count, a count per
client address, and an estimate of the bytes they hold. Past it the oldest end first, and
their resume tokens then get 410.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    """A detached conversation: its id, its client's address key ('' when unknown), when its
    connection was lost (ms on the conversation clock) and the bytes it holds (an estimate)."""

    session_id: str
    client: str
    since_ms: float
    held_bytes: int


@dataclass(frozen=True)
class DetachedBound:
    """How many detached conversations may wait: in all, per client address, and in bytes."""

    count: int
    per_client: int
    bytes: int

    def __post_init__(self) -> None:
        assert self.count >= 0 and self.per_client >= 0 and self.bytes >= 0, self


def evictions(waiting: Sequence[Waiting], bound: DetachedBound) -> list[str]:
    """The ids of the detached conversations to end, oldest first, so that the ones left keep
    ``bound``: first a client's oldest past its share, then the oldest of all past the count,
    then the oldest of all while the bytes held exceed the bound."""
    kept = sorted(waiting, key=lambda w: (w.since_ms, w.session_id))
    ended: list[str] = []
    per_client = Counter(w.client for w in kept if w.client)
    for w in list(kept):
        if w.client and per_client[w.client] > bound.per_client:
            per_client[w.client] -= 1
            kept.remove(w)
            ended.append(w.session_id)
    while len(kept) > bound.count:
        ended.append(kept.pop(0).session_id)
    held = sum(w.held_bytes for w in kept)
    while kept and held > bound.bytes:
        oldest = kept.pop(0)
        held -= oldest.held_bytes
        ended.append(oldest.session_id)
    assert len(set(ended)) == len(ended)
    return ended
