"""Per-key token buckets: how many sessions one client address may create, and how fast (and
how often one session may trickle candidates).

Each key (a client, a session) has a bucket of ``burst`` tokens that refills at
``rate_per_min`` tokens a minute; each request takes one. Time comes from an injected
:class:`Clock`. :func:`client_key` names a client for every per-client limit.
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from dataclasses import dataclass

from server.clock import Clock

MAX_KEYS = 10_000  # buckets kept; the least recently used is forgotten (it refilled anyway)
IPV6_CLIENT_PREFIX = 64  # one IPv6 client (a home, a host) has a whole /64 to rotate through


def client_key(address: str) -> str:
    """The key of a client address for per-client limits: an IPv4 address (also written as
    IPv4-mapped IPv6) as it is, an IPv6 address as its /64 (``2001:db8:1:2::/64``; loopback
    and link-local ones, which every link shares, as they are); anything else as given."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        if not (ip.is_loopback or ip.is_link_local):
            return str(ipaddress.IPv6Network((ip, IPV6_CLIENT_PREFIX), strict=False))
    return str(ip)


@dataclass
class _Bucket:
    tokens: float
    updated_ms: float


@dataclass(frozen=True)
class Decision:
    """``allowed``, or the whole seconds until a token is back (for ``Retry-After``)."""

    allowed: bool
    retry_after_s: int = 0


class RateLimiter:
    """Token buckets keyed by client address; ``rate_per_min == 0`` allows everything."""

    def __init__(
        self, rate_per_min: float, burst: int, clock: Clock, max_keys: int = MAX_KEYS
    ) -> None:
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self.rate_per_ms = rate_per_min / 60_000
        self.burst = burst
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.rate_per_ms > 0

    def take(self, key: str) -> Decision:
        """Take one token from ``key``'s bucket if it has one."""
        if not self.enabled:
            return Decision(True)
        now = self._clock.now_ms()
        bucket = self._buckets.pop(key, None) or _Bucket(float(self.burst), now)
        elapsed = max(0.0, now - bucket.updated_ms)
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.rate_per_ms)
        bucket.updated_ms = now
        self._buckets[key] = bucket  # most recently used last
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return Decision(True)
        wait_ms = (1.0 - bucket.tokens) / self.rate_per_ms
        return Decision(False, max(1, math.ceil(wait_ms / 1000)))

    def __len__(self) -> int:
        return len(self._buckets)
