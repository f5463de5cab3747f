"""Which replica of a remote LLM serves a request: prefix affinity first, then the least loaded.

A session's prefix warm-ups only help if its reply goes to the replica that holds that prefix in
its KV cache, so a request goes to the replica that recently served the longest prompt sharing
its beginning (and its cache salt, see :func:`prompt_key`), if that shared part reaches
``MIN_SHARED_CHARS`` past the first message (the persona). Without such a replica, the one with
the fewest requests in flight (ties in turn). A replica that failed is tried last for
``down_s`` seconds. Plain bookkeeping: no I/O, times in seconds.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

REMEMBERED_PROMPTS = 64  # recent prompts kept per replica for prefix affinity
AFFINITY_SLACK = 4  # affinity yields when its replica has this many more requests in flight
MIN_SHARED_CHARS = 32  # shared text past the persona that makes affinity (~8 tokens)


def prompt_key(messages: Sequence[Mapping[str, str]], scope: str = "") -> tuple[str, int]:
    """A chat as one string whose prefixes follow the chat's, and the length of its first
    message's part (the shared persona: a match no longer than that says nothing).

    ``scope``: the request's cache salt. Requests of different salts share no cached blocks,
    so the key starts with it and affinity holds only within one scope.
    """
    head = f"{scope}\x1d" if scope else ""
    parts = [f"{m.get('role', '')}\x1f{m.get('content', '')}\x1e" for m in messages]
    return head + "".join(parts), len(head) + (len(parts[0]) if parts else 0)


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search over slice comparisons)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass(frozen=True)
class ReplicaStatus:
    """A replica's counters: requests in flight, served (a token came), failed attempts."""

    url: str
    in_flight: int
    served: int
    failures: int
    down: bool


class Replica:
    """One server's live counters and the prompts it served recently."""

    def __init__(self, index: int, url: str, remembered: int) -> None:
        self.index = index
        self.url = url
        self.in_flight = 0
        self.served = 0
        self.failures = 0
        self.down_until = 0.0  # clock time (s) until which it is tried last
        self._recent: deque[str] = deque(maxlen=remembered)

    def shared_prefix(self, prompt: str) -> int:
        """The longest prefix ``prompt`` shares with a prompt this replica served recently."""
        return max((common_prefix_len(prompt, seen) for seen in self._recent), default=0)

    def remember(self, prompt: str) -> None:
        if prompt in self._recent:
            self._recent.remove(prompt)
        self._recent.append(prompt)


class ReplicaSet:
    """The replicas of one model and the rule that orders them for each request."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        down_s: float,
        remembered: int = REMEMBERED_PROMPTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("at least one replica URL is needed")
        self.replicas = [Replica(i, url, remembered) for i, url in enumerate(urls)]
        self._down_s = down_s
        self._clock = clock
        self._turn = itertools.count()

    def order(self, prompt: str, anchor_len: int) -> list[Replica]:
        """Replicas to try for ``prompt``, best first; every replica appears once."""
        now = self._clock()
        up = [r for r in self.replicas if r.down_until <= now]
        down = sorted((r for r in self.replicas if r.down_until > now), key=lambda r: r.down_until)
        turn = next(self._turn) % len(self.replicas)
        by_load = sorted(up, key=lambda r: (r.in_flight, (r.index - turn) % len(self.replicas)))
        if by_load:
            least = by_load[0].in_flight
            matches = [(r.shared_prefix(prompt), r) for r in by_load]
            best_len, best = max(matches, key=lambda m: m[0])  # max keeps the first of equals
            shared = best_len - anchor_len
            if shared >= MIN_SHARED_CHARS and best.in_flight < least + AFFINITY_SLACK:
                by_load.remove(best)
                by_load.insert(0, best)
        return by_load + down

    def started(self, replica: Replica) -> None:
        replica.in_flight += 1

    def ended(self, replica: Replica) -> None:
        replica.in_flight -= 1

    def served(self, replica: Replica, prompt: str) -> None:
        """A token came back: the replica is up and now holds ``prompt``'s prefix."""
        replica.served += 1
        replica.down_until = 0.0
        replica.remember(prompt)

    def failed(self, replica: Replica) -> None:
        replica.failures += 1
        replica.down_until = self._clock() + self._down_s

    def status(self) -> list[ReplicaStatus]:
        now = self._clock()
        return [
            ReplicaStatus(r.url, r.in_flight, r.served, r.failures, r.down_until > now)
            for r in self.replicas
        ]
