"""One session's budgets for what its client sends: events, and inbound audio packets and the
time they cover. Decisions only: every call is told the time (``now_ms``, a monotonic clock in
ms); the owner (the inbox, the audio jitter buffer) carries each verdict out.

- :class:`Bucket`: a token bucket (``Rate``: tokens back a second, most held).
- :class:`FloodWatch`: a sender over ``FLOOD_FACTOR`` times its rate for whole seconds in a
  row: one to end, not to throttle; :class:`FloodGate` says so once, then drops the rest.
- :class:`Throttle`: client events. Past the budget an event is dropped unanswered, but for
  one ``rate_limited`` answer per throttling episode (it lasts until the bucket is full again).
- :class:`MediaBudget`: inbound audio packets (a packet rate), and the audio they make heard,
  their own and the lost time between them filled with concealment and silence, at most
  ``HEARD_SPEEDUP`` times real time; a gap in the timestamps over ``max_gap_ms`` is a
  discontinuity, joined without filling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

FLOOD_FACTOR = 10.0  # a sender this many times over its rate, for seconds, is ended
FLOOD_WINDOW_MS = 1000.0
HEARD_SPEEDUP = 1.5  # audio heard (real and filled) a second, in seconds: a sender's 1 + slack
HEARD_BACKLOG_MS = 2000.0  # audio that may arrive at once after a network stall


@dataclass(frozen=True)
class Rate:
    """A token bucket's refill (``per_s`` tokens a second; 0: no limit) and size (``burst``)."""

    per_s: float
    burst: float

    @property
    def limited(self) -> bool:
        return self.per_s > 0


@dataclass(frozen=True)
class Bucket:
    """``tokens`` of ``rate`` as of ``at_ms`` (None: never used, so full)."""

    rate: Rate
    tokens: float
    at_ms: float | None = None

    @classmethod
    def full(cls, rate: Rate) -> Bucket:
        return cls(rate, rate.burst)

    def at(self, now_ms: float) -> Bucket:
        """The bucket refilled to ``now_ms`` (a clock that went back refills nothing)."""
        if self.at_ms is None:
            return replace(self, tokens=self.rate.burst, at_ms=now_ms)
        elapsed_s = max(0.0, now_ms - self.at_ms) / 1000
        tokens = min(self.rate.burst, self.tokens + elapsed_s * self.rate.per_s)
        return replace(self, tokens=tokens, at_ms=max(now_ms, self.at_ms))

    def take(self, now_ms: float, cost: float = 1.0) -> Bucket | None:
        """The bucket with ``cost`` tokens taken at ``now_ms``; None when it holds fewer."""
        bucket = self.at(now_ms)
        if bucket.tokens < cost:
            return None
        return replace(bucket, tokens=bucket.tokens - cost)

    @property
    def is_full(self) -> bool:
        return self.tokens >= self.rate.burst


class FloodWatch:
    """Whether a sender has offered more than ``FLOOD_FACTOR * per_s`` items in each of
    ``seconds`` consecutive 1 s windows (the last one counting as it fills); never where
    ``per_s`` or ``seconds`` is 0."""

    def __init__(self, per_s: float, seconds: float) -> None:
        self._limit = FLOOD_FACTOR * per_s
        self._windows = math.ceil(seconds) if per_s > 0 else 0
        self._start_ms: float | None = None
        self._count = 0
        self._over = 0  # closed windows in a row over the limit

    def offered(self, now_ms: float) -> bool:
        """Count one item at ``now_ms``; True once the sender floods for long enough."""
        if self._windows == 0:
            return False
        if self._start_ms is None:
            self._start_ms = now_ms
        passed = int((now_ms - self._start_ms) // FLOOD_WINDOW_MS)
        if passed > 0:
            over = self._count > self._limit and passed == 1  # an empty window breaks a run
            self._over = self._over + 1 if over else 0
            self._start_ms += passed * FLOOD_WINDOW_MS
            self._count = 0
        self._count += 1
        return self._count > self._limit and self._over + 1 >= self._windows


class Admission(Enum):
    """What becomes of one item a client sent."""

    TAKE = "take"  # within the budget
    REFUSE = "refuse"  # over it, the first of a throttling episode: answer once
    DROP = "drop"  # over it: dropped, unanswered
    END = "end"  # far over it for seconds: end the session (said once)


class FloodGate:
    """A :class:`FloodWatch` that says END once, then DROP for everything after it."""

    def __init__(self, per_s: float, seconds: float) -> None:
        self._watch = FloodWatch(per_s, seconds)
        self._ended = False

    def verdict(self, now_ms: float) -> Admission | None:
        """For one item at ``now_ms``: END when the flood has lasted long enough, DROP for
        any item after that, None while the sender is not (yet) ended."""
        if self._ended:
            return Admission.DROP
        if self._watch.offered(now_ms):
            self._ended = True
            return Admission.END
        return None


class Throttle:
    """A session's client events: ``rate`` a second with a burst; past ``FLOOD_FACTOR``
    times the rate for ``flood_s`` seconds in a row, the end."""

    def __init__(self, rate: Rate, flood_s: float) -> None:
        self._bucket = Bucket.full(rate)
        self._flood = FloodGate(rate.per_s, flood_s)
        self._throttled = False  # in an episode: its one answer was given

    def admit(self, now_ms: float) -> Admission:
        """The fate of one event arriving at ``now_ms``."""
        if not self._bucket.rate.limited:
            return Admission.TAKE
        flooded = self._flood.verdict(now_ms)
        if flooded is not None:
            return flooded
        bucket = self._bucket.at(now_ms)
        if bucket.is_full:
            self._throttled = False  # quiet long enough: the episode is over
        taken = bucket.take(now_ms)
        self._bucket = bucket if taken is None else taken
        if taken is not None:
            return Admission.TAKE
        if self._throttled:
            return Admission.DROP
        self._throttled = True
        return Admission.REFUSE


class Heard(Enum):
    """What becomes of one inbound audio packet within the audio budget."""

    PLAY = "play"  # as it is: a gap before it is filled downstream (concealment, silence)
    JOIN = "join"  # a discontinuity (a gap over the cap, time going back): joined, not filled
    JOIN_LIMITED = "join_limited"  # its gap was within the cap, not within the budget
    DROP = "drop"  # not even its own audio fits the budget


class MediaBudget:
    """A session's inbound audio: ``packets`` a second with a burst (0: no limit), the audio
    heard (packets and the gaps filled between them) at most ``HEARD_SPEEDUP`` seconds a
    second beyond a burst of ``max_gap_ms + HEARD_BACKLOG_MS``, and no gap over ``max_gap_ms``
    filled. ``flood_s``: packets past ``FLOOD_FACTOR`` times their rate for this many seconds
    in a row end the session (0: never)."""

    def __init__(self, packets: Rate, max_gap_ms: float, flood_s: float) -> None:
        self._packets = Bucket.full(packets)
        self._heard = Bucket.full(Rate(HEARD_SPEEDUP * 1000, max_gap_ms + HEARD_BACKLOG_MS))
        self._max_gap_ms = max_gap_ms
        self._flood = FloodGate(packets.per_s, flood_s)

    def packet(self, now_ms: float) -> Admission:
        """The fate of one packet arriving at ``now_ms``: TAKE, DROP, or END once."""
        if not self._packets.rate.limited:
            return Admission.TAKE
        flooded = self._flood.verdict(now_ms)
        if flooded is not None:
            return flooded
        taken = self._packets.take(now_ms)
        if taken is None:
            self._packets = self._packets.at(now_ms)
            return Admission.DROP
        self._packets = taken
        return Admission.TAKE

    def audio(self, now_ms: float, duration_ms: float, gap_ms: float) -> Heard:
        """The fate of a packet of ``duration_ms`` whose timestamp is ``gap_ms`` after where
        the last one's audio ended (negative: before it)."""
        if gap_ms < 0 or gap_ms > self._max_gap_ms:
            fill, discontinuity = 0.0, gap_ms != 0
        else:
            fill, discontinuity = gap_ms, False
        if not self._packets.rate.limited:
            return Heard.JOIN if discontinuity else Heard.PLAY
        whole = self._heard.take(now_ms, duration_ms + fill)
        if whole is not None:
            self._heard = whole
            return Heard.JOIN if discontinuity else Heard.PLAY
        alone = self._heard.take(now_ms, duration_ms)
        if alone is None:
            self._heard = self._heard.at(now_ms)
            return Heard.DROP
        self._heard = alone
        return Heard.JOIN_LIMITED
