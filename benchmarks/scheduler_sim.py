"""Simulation: N sessions sharing one engine, earliest-deadline-first versus round-robin.

Each simulated session converses in a closed loop: the user speaks, the turn ends, the engine
generates the reply chunk by chunk (one work item per sentence, service time proportional to the
audio it produces), playback drains the buffer in real time, and sometimes the user barges in.
The real schedulers from ``server.scheduler`` pick the work; time is simulated (no sleeping), so
a run is deterministic for a seed.

Figures per policy: deadline misses (= playback underruns: a playing reply ran dry before its
next chunk), time to first audio (end of turn -> first chunk ready), and compute spent on stale
epochs (work started after the bump that made it stale, and in-flight work at the bump).

Run: ``.venv/bin/python -m benchmarks.scheduler_sim`` (``--quick`` for a short smoke run).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from benchmarks import pct
from server.chunk import Stage
from server.config import SchedulerConfig
from server.scheduler import (
    DeadlineScheduler,
    RoundRobinScheduler,
    Scheduler,
    SessionView,
    WorkItem,
)

TICK_MS = 5.0
USER_MS = (1000.0, 3000.0)  # user speech + pause before the turn ends
CHUNKS = (2, 5)  # sentences per reply
CHUNK_MS = (1200.0, 2400.0)  # audio per sentence
BARGE_P = 0.25  # share of replies the user interrupts
BUDGET_MS = 2000.0


class Policy(Enum):
    EDF = "edf"
    RR = "round_robin"  # plain: no epochs, no budget, no abort
    RR_AWARE = "round_robin_aware"  # round-robin order with the epoch/budget filters of EDF


class Phase(Enum):
    USER = "user"
    WAIT = "wait"  # turn ended, no audio yet
    PLAY = "play"


@dataclass
class SimSession:
    sid: str
    rng: random.Random
    phase: Phase = Phase.USER
    epoch: int = 0
    phase_end: float = 0.0
    turn_end: float = 0.0
    chunks_left: list[float] = field(default_factory=list)
    buffered: float = 0.0
    played: float = 0.0
    barge_at: float | None = None
    in_gap: bool = False
    queued: bool = False


@dataclass(frozen=True)
class SimResult:
    policy: str
    sessions: int
    overload: float
    duration_s: float
    replies: int
    barge_ins: int
    underruns: int
    underrun_ms: float
    ttfa_p50_ms: float
    ttfa_p95_ms: float
    stale_scheduled: int
    stale_compute_ms: float
    aborted_in_flight_ms: float
    engine_busy: float


def _mean(bounds: tuple[float, float]) -> float:
    return (bounds[0] + bounds[1]) / 2


def cost_per_audio_ms(sessions: int, overload: float) -> float:
    """Engine ms per ms of reply audio so that the offered load is ``overload`` x capacity."""
    reply_ms = _mean((float(CHUNKS[0]), float(CHUNKS[1]))) * _mean(CHUNK_MS)
    return overload * (_mean(USER_MS) + reply_ms) / (sessions * reply_ms)


def _scheduler(policy: Policy) -> Scheduler:
    if policy is Policy.EDF:
        return DeadlineScheduler(SchedulerConfig())  # the server's defaults
    return RoundRobinScheduler(aware=policy is Policy.RR_AWARE)


def simulate(
    policy: Policy, n: int, overload: float, seed: int = 1, duration_ms: float = 120_000.0
) -> SimResult:
    """Run one closed-loop simulation and return its figures."""
    k = cost_per_audio_ms(n, overload)
    aware = policy is not Policy.RR
    sched = _scheduler(policy)
    sessions = [SimSession(f"s{i:02d}", random.Random(seed * 1000 + i)) for i in range(n)]
    by_id = {s.sid: s for s in sessions}
    for s in sessions:
        s.phase_end = s.rng.uniform(*USER_MS)
    queue: list[WorkItem] = []
    outputs: dict[int, float] = {}
    running: WorkItem | None = None
    run_started = run_end = 0.0
    next_id = 0
    replies = barge_ins = underruns = stale_scheduled = 0
    underrun_ms = stale_ms = aborted_ms = busy_ms = 0.0
    ttfa: list[float] = []

    def start_reply(s: SimSession, now: float) -> None:
        s.phase, s.turn_end = Phase.WAIT, now
        s.chunks_left = [s.rng.uniform(*CHUNK_MS) for _ in range(s.rng.randint(*CHUNKS))]
        total = sum(s.chunks_left)
        s.barge_at = s.rng.uniform(0.2, 0.8) * total if s.rng.random() < BARGE_P else None
        s.buffered = s.played = 0.0
        s.in_gap = False

    def to_user(s: SimSession, now: float) -> None:
        s.phase, s.phase_end = Phase.USER, now + s.rng.uniform(*USER_MS)
        s.chunks_left, s.buffered = [], 0.0

    now = 0.0
    while now < duration_ms:
        # 1. user side and playback, one tick
        for s in sessions:
            if s.phase is Phase.USER and now >= s.phase_end:
                start_reply(s, now)
            elif s.phase is Phase.PLAY:
                step = min(TICK_MS, s.buffered)
                s.buffered -= step
                s.played += step
                short = TICK_MS - step
                if s.barge_at is not None and s.played >= s.barge_at:
                    barge_ins += 1
                    s.epoch += 1  # barge-in: everything older is stale
                    if aware and running is not None and running.session_id == s.sid:
                        aborted_ms += now - run_started
                        running = None
                    to_user(s, now)
                elif short > 0 and (s.chunks_left or s.queued):
                    underrun_ms += short
                    if not s.in_gap:
                        underruns += 1
                    s.in_gap = True
                elif short > 0:
                    replies += 1
                    to_user(s, now)
                else:
                    s.in_gap = False
            # the next chunk of a reply becomes a work item
            if s.phase in (Phase.WAIT, Phase.PLAY) and s.chunks_left and not s.queued:
                audio = s.chunks_left.pop(0)
                item = WorkItem(next_id, s.sid, Stage.LLM, s.epoch, audio * k, now)
                outputs[next_id] = audio
                next_id += 1
                queue.append(item)
                s.queued = True
        # 2. the engine finishes its item
        if running is not None and now >= run_end:
            owner = by_id[running.session_id]
            owner.queued = False
            if running.epoch == owner.epoch and owner.phase in (Phase.WAIT, Phase.PLAY):
                if owner.phase is Phase.WAIT:
                    ttfa.append(now - owner.turn_end)
                    owner.phase = Phase.PLAY
                owner.buffered += outputs[running.item_id]
            else:
                stale_ms += running.est_cost_ms
            running = None
        # a plain engine keeps stale items; their sessions may queue again only when drained
        for s in sessions:
            if (
                s.queued
                and not any(i.session_id == s.sid for i in queue)
                and (running is None or running.session_id != s.sid)
            ):
                s.queued = False
        # 3. the engine picks its next item
        if running is None and queue:
            views = {
                s.sid: SessionView(
                    s.sid,
                    s.epoch,
                    s.buffered,
                    BUDGET_MS,
                    s.turn_end if s.phase is Phase.WAIT else None,
                )
                for s in sessions
            }
            plan = sched.schedule(now, queue, views, max_items=1)
            dropped = {i.item_id for i in plan.stale}
            for item in plan.stale:
                by_id[item.session_id].queued = False
            queue = [i for i in queue if i.item_id not in dropped]
            if plan.run:
                running = plan.run[0]
                queue = [i for i in queue if i.item_id != running.item_id]
                if running.epoch < by_id[running.session_id].epoch:
                    stale_scheduled += 1
                run_started, run_end = now, now + running.est_cost_ms
        if running is not None:
            busy_ms += TICK_MS
        now += TICK_MS

    return SimResult(
        policy=policy.value,
        sessions=n,
        overload=overload,
        duration_s=duration_ms / 1000,
        replies=replies,
        barge_ins=barge_ins,
        underruns=underruns,
        underrun_ms=round(underrun_ms, 1),
        ttfa_p50_ms=round(statistics.median(ttfa), 1) if ttfa else float("nan"),
        ttfa_p95_ms=round(pct(ttfa, 0.95), 1),
        stale_scheduled=stale_scheduled,
        stale_compute_ms=round(stale_ms, 1),
        aborted_in_flight_ms=round(aborted_ms, 1),
        engine_busy=round(busy_ms / duration_ms, 3),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/scheduler_sim.json"))
    args = parser.parse_args(argv)
    sizes = (8,) if args.quick else (8, 16, 32)
    seeds = range(1, 2 if args.quick else args.seeds + 1)
    duration = 20_000.0 if args.quick else 180_000.0
    results = []
    print(
        f"{'N':>3} {'load':>4} {'policy':<18} {'misses':>6} {'miss ms':>8} {'ttfa p50':>8}"
        f" {'ttfa p95':>8} {'stale sched':>11} {'stale ms':>8} {'aborted ms':>10}"
    )
    for n in sizes:
        for overload in (1.0, 1.5, 2.0):
            row: dict[str, SimResult] = {}
            for policy in Policy:
                runs = [simulate(policy, n, overload, seed, duration) for seed in seeds]
                merged = SimResult(
                    policy=policy.value,
                    sessions=n,
                    overload=overload,
                    duration_s=sum(r.duration_s for r in runs),
                    replies=sum(r.replies for r in runs),
                    barge_ins=sum(r.barge_ins for r in runs),
                    underruns=sum(r.underruns for r in runs),
                    underrun_ms=round(sum(r.underrun_ms for r in runs), 1),
                    ttfa_p50_ms=round(statistics.median(r.ttfa_p50_ms for r in runs), 1),
                    ttfa_p95_ms=round(statistics.median(r.ttfa_p95_ms for r in runs), 1),
                    stale_scheduled=sum(r.stale_scheduled for r in runs),
                    stale_compute_ms=round(sum(r.stale_compute_ms for r in runs), 1),
                    aborted_in_flight_ms=round(sum(r.aborted_in_flight_ms for r in runs), 1),
                    engine_busy=round(statistics.mean(r.engine_busy for r in runs), 3),
                )
                row[policy.value] = merged
                results.append(asdict(merged))
                print(
                    f"{n:>3} {overload:>4} {policy.value:<18} {merged.underruns:>6}"
                    f" {merged.underrun_ms:>8.0f} {merged.ttfa_p50_ms:>8.0f}"
                    f" {merged.ttfa_p95_ms:>8.0f} {merged.stale_scheduled:>11}"
                    f" {merged.stale_compute_ms:>8.0f} {merged.aborted_in_flight_ms:>10.0f}"
                )
            edf, rr = row["edf"], row["round_robin"]
            ratio = edf.underruns / rr.underruns if rr.underruns else float("nan")
            print(f"    EDF/RR misses = {ratio:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
