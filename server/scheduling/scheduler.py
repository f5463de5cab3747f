"""Deadline scheduling of engine work shared by many sessions.

``schedule()`` is synchronous and I/O-free: given the runnable work items and a view of each
session, it returns a :class:`Plan` (what to run now, in order; what waits; what is deferred
because its session is past the lookahead budget; what is stale and must be dropped).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from server.config import SchedulerConfig
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkItem:
    """One runnable unit of engine work; ``est_cost_ms`` is its expected engine time."""

    item_id: int
    session_id: str
    stage: Stage
    epoch: int
    est_cost_ms: float
    enqueued_ms: float
    optional: bool = False  # nice to have (a partial transcript): shed before delaying others


@dataclass(frozen=True)
class Plan:
    """The result of one scheduling step."""

    run: tuple[WorkItem, ...]
    waiting: tuple[WorkItem, ...]
    deferred: tuple[WorkItem, ...]
    stale: tuple[WorkItem, ...]
    shed: tuple[WorkItem, ...] = ()  # optional work dropped: required work was waiting


class Scheduler(Protocol):
    """A policy that orders runnable work."""

    def schedule(
        self,
        now_ms: float,
        items: Sequence[WorkItem],
        sessions: Mapping[str, SessionView],
        max_items: int,
    ) -> Plan:
        """Pick up to ``max_items`` items to run now, in order."""
        ...

    def forget(self, session_id: str) -> None:
        """The session ended; drop whatever the policy keeps about it."""
        ...


def _is_stale(item: WorkItem, sessions: Mapping[str, SessionView]) -> bool:
    view = sessions.get(item.session_id)
    return view is None or item.epoch < view.epoch


def _over_budget(view: SessionView) -> bool:
    """Past the lookahead budget: more playback is buffered than the session may hold."""
    return view.slack_ms >= view.budget_ms


def _holds(view: SessionView) -> bool:
    """The session's playback work waits: past its budget, or its reply paused."""
    return view.paused or _over_budget(view)


def _partition(
    items: Sequence[WorkItem], sessions: Mapping[str, SessionView]
) -> tuple[list[WorkItem], list[WorkItem], list[WorkItem], list[WorkItem]]:
    """Split work into (stale, deferred: session past its budget, shed, runnable). Optional
    work is shed whenever required work is runnable: running it first would delay a final
    transcript or a reply's speech by its whole cost. Recognition adds no playback, so it is
    never deferred (a paused reply's buffer is full while the voice over it is judged). The
    rest of a paused reply waits too: the voice over it is heard first, and the reply may
    not go on at all."""
    stale, deferred, runnable = [], [], []
    for item in items:
        if _is_stale(item, sessions):
            stale.append(item)
        elif item.stage is not Stage.ASR and _holds(sessions[item.session_id]):
            deferred.append(item)
        else:
            runnable.append(item)
    shed: list[WorkItem] = []
    if any(not item.optional for item in runnable):
        shed = [item for item in runnable if item.optional]
        runnable = [item for item in runnable if not item.optional]
    return stale, deferred, shed, runnable


def latest_start_ms(
    config: SchedulerConfig, now_ms: float, item: WorkItem, view: SessionView
) -> float:
    """When ``item`` must start (ms) for its session to meet its deadline: the first-audio
    target of a reply not yet playing, else before the buffered playback runs out."""
    if view.waiting_since_ms is not None:
        due = view.waiting_since_ms + config.first_audio_target_ms
    else:
        due = now_ms + view.slack_ms
    return due - item.est_cost_ms


class DeadlineScheduler:
    """Earliest deadline first, overload-aware, with aging so that no session starves.

    Latest start of an item: when its session would notice it missing, minus its cost:
    ``waiting_since + first_audio_target`` for a reply that has not started playing,
    ``now + slack`` for one that is playing. Items that can still make their deadline run in
    EDF order. An item already late (a reply past its first-audio target, a playback that will
    gap anyway) runs only when the slack of the on-time items covers its cost, so lateness does
    not spread to sessions that are still on time (plain EDF's domino effect under overload).
    Late items: playing replies first (their gap grows), then replies yet to start, oldest
    deadline first, so waiting replies start in turn-end order. Aging, the
    hard bound: an item waiting ``max_wait_ms`` goes first whatever else is pending. Ties go to
    the session served least so far, then to the oldest item.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.served: Counter[str] = Counter()

    def deadline_ms(self, now_ms: float, item: WorkItem, view: SessionView) -> float:
        """Latest start time (ms) of ``item`` before its session misses a deadline."""
        return latest_start_ms(self.config, now_ms, item, view)

    def schedule(
        self,
        now_ms: float,
        items: Sequence[WorkItem],
        sessions: Mapping[str, SessionView],
        max_items: int,
    ) -> Plan:
        stale, deferred, shed, runnable = _partition(items, sessions)

        start = {i.item_id: self.deadline_ms(now_ms, i, sessions[i.session_id]) for i in runnable}

        def key(item: WorkItem) -> tuple[float, int, float, int]:
            return (
                start[item.item_id],
                self.served[item.session_id],
                item.enqueued_ms,
                item.item_id,
            )

        remaining = sorted(runnable, key=key)
        run: list[WorkItem] = []
        t = now_ms  # planned start of the next pick
        fresh = {i.item_id for i in runnable if sessions[i.session_id].waiting_since_ms is not None}
        while remaining and len(run) < max_items:
            pick = self._pick(t, remaining, start, fresh)
            remaining.remove(pick)
            run.append(pick)
            t += pick.est_cost_ms
        for item in run:
            assert item.epoch == sessions[item.session_id].epoch, "stale work scheduled"
            self.served[item.session_id] += 1
        return Plan(tuple(run), tuple(remaining), tuple(deferred), tuple(stale), tuple(shed))

    def _pick(
        self,
        t: float,
        ordered: list[WorkItem],
        start: Mapping[int, float],
        fresh: set[int],
    ) -> WorkItem:
        """Next item at planned time ``t`` from ``ordered`` (sorted by latest start).

        ``fresh``: items of replies that have not started playing; among late items, a playing
        reply (whose gap grows with every ms) goes before a reply that has yet to start.
        """
        max_wait = self.config.max_wait_ms
        aged = [i for i in ordered if i.enqueued_ms + max_wait <= t]
        if aged:
            return min(aged, key=lambda i: (i.enqueued_ms, i.item_id))
        on_time = [i for i in ordered if start[i.item_id] >= t]
        late = sorted(
            (i for i in ordered if start[i.item_id] < t), key=lambda i: i.item_id in fresh
        )
        if not late:
            return on_time[0]
        if not on_time:
            return late[0]
        # slack of the on-time items if they run next in EDF order
        spare, clock = float("inf"), t
        for item in on_time:
            spare = min(spare, start[item.item_id] - clock)
            clock += item.est_cost_ms
        return late[0] if spare >= late[0].est_cost_ms else on_time[0]

    def forget(self, session_id: str) -> None:
        """The session ended; drop its fairness record."""
        self.served.pop(session_id, None)


class RoundRobinScheduler:
    """Plain round-robin over sessions, oldest item first within a session.

    With ``aware=False`` (plain) it knows neither epochs nor budgets: the baseline that the
    deadline scheduler is measured against. With ``aware=True`` it drops stale work and defers
    sessions past their budget, isolating the effect of the ordering alone.
    """

    def __init__(self, aware: bool = False) -> None:
        self.aware = aware
        self._ring: list[str] = []
        self._last: str | None = None

    def schedule(
        self,
        now_ms: float,
        items: Sequence[WorkItem],
        sessions: Mapping[str, SessionView],
        max_items: int,
    ) -> Plan:
        for item in items:
            if item.session_id not in self._ring:
                self._ring.append(item.session_id)
        if self.aware:
            stale, deferred, shed, runnable = _partition(items, sessions)
        else:
            stale, deferred, shed, runnable = [], [], [], list(items)
        start = self._ring.index(self._last) + 1 if self._last in self._ring else 0
        rank = {sid: (i - start) % len(self._ring) for i, sid in enumerate(self._ring)}
        per_session: dict[str, list[WorkItem]] = {}
        for item in sorted(runnable, key=lambda it: (it.enqueued_ms, it.item_id)):
            per_session.setdefault(item.session_id, []).append(item)
        order: list[WorkItem] = []
        queues = sorted(per_session.items(), key=lambda kv: rank[kv[0]])
        while any(q for _, q in queues):
            for _, queue in queues:
                if queue:
                    order.append(queue.pop(0))
        run = order[:max_items]
        if run:
            self._last = run[-1].session_id
        plan = (tuple(run), tuple(order[max_items:]), tuple(deferred), tuple(stale), tuple(shed))
        return Plan(*plan)

    def forget(self, session_id: str) -> None:
        """The session ended; drop it from the ring (the turn passes to its successor)."""
        if session_id in self._ring:
            if self._last == session_id:
                idx = self._ring.index(session_id)
                self._last = self._ring[idx - 1] if len(self._ring) > 1 else None
            self._ring.remove(session_id)


def make_scheduler(config: SchedulerConfig) -> DeadlineScheduler | RoundRobinScheduler:
    """The policy named in the configuration."""
    if config.policy == "round_robin":
        return RoundRobinScheduler(aware=True)
    return DeadlineScheduler(config)
