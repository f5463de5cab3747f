"""Simulation: N sessions sharing one engine, earliest-deadline-first versus round-robin.

Each simulated session converses in a closed loop: the user speaks, the turn ends, the engine
generates the reply chunk by chunk (one work item per sentence, service time proportional to the
audio it produces), playback drains the buffer in real time, and sometimes the user barges in.
The real schedulers from ``server.scheduler`` pick the work; time is simulated (no sleeping), so
a run is deterministic for a seed and does not depend on the machine.

Policies: ``edf`` (the server's default, :class:`DeadlineScheduler`), ``round_robin`` (plain: no
stale-epoch drop, no lookahead budget, no abort of in-flight stale work) and
``round_robin_aware`` (the same epochs, budget and abort as EDF: the server's own
``scheduler.policy = round_robin``, so only the order differs from EDF).

Figures per policy, both kinds of miss: underruns (a playing reply ran dry before its next chunk:
count and total gap time) and first-audio misses (a reply's first audio came later than
``SchedulerConfig.first_audio_target_ms`` after the end of the turn, including replies still
waiting past it when the run ends); time to first audio (end of turn -> first chunk ready); and
compute spent on stale epochs (work started after the bump that made it stale, and in-flight
work at the bump).

Run: ``.venv/bin/python -m benchmarks.scheduler_sim`` (``--quick`` for a short smoke run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from benchmarks import git, pct
from server.config import SchedulerConfig
from server.machine import this_machine
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.scheduling.scheduler import (
    DeadlineScheduler,
    RoundRobinScheduler,
    Scheduler,
    WorkItem,
)

TICK_MS = 5.0
USER_MS = (1000.0, 3000.0)  # user speech + pause before the turn ends
CHUNKS = (2, 5)  # sentences per reply
CHUNK_MS = (1200.0, 2400.0)  # audio per sentence
BARGE_P = 0.25  # share of replies the user interrupts
BUDGET_MS = 2000.0
SIZES = (8, 16, 32)
LOADS = (1.0, 1.5, 2.0)
SOURCES = ("server/scheduling/scheduler.py", "benchmarks/scheduler_sim.py")


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
    """Figures of one cell (policy x sessions x load), summed or pooled over its seeds.

    ``turns``: user turns that ended (replies started). ``replies``: replies played to the end.
    ``underruns``: gaps in playing replies (a miss of the playback deadline); ``underrun_ms``:
    their total length. ``first_audio_misses``: replies whose first audio came later than
    ``first_audio_target_ms`` after the end of the turn, ``first_audio_unserved`` of them still
    waiting (past the target) when the run ended. TTFA percentiles pool the replies of all seeds.
    ``wait_per_turn_ms``: all the time users waited on the bot (end of turn to first audio, the
    wait of replies still without audio at the end, and gaps), divided by ``turns``.
    """

    policy: str
    sessions: int
    overload: float
    seeds: int
    duration_s: float
    turns: int
    replies: int
    barge_ins: int
    underruns: int
    underrun_ms: float
    first_audio_target_ms: float
    first_audio_misses: int
    first_audio_unserved: int
    ttfa_p50_ms: float
    ttfa_p95_ms: float
    ttfa_mean_ms: float
    wait_per_turn_ms: float
    stale_scheduled: int
    stale_compute_ms: float
    aborted_in_flight_ms: float
    engine_busy: float


@dataclass
class _Run:
    """Raw tallies of one seed."""

    duration_ms: float
    turns: int = 0
    replies: int = 0
    barge_ins: int = 0
    underruns: int = 0
    underrun_ms: float = 0.0
    unserved: int = 0  # still waiting past the first-audio target at the end
    waiting_at_end_ms: float = 0.0  # how long the replies still without audio have waited
    stale_scheduled: int = 0
    stale_ms: float = 0.0
    aborted_ms: float = 0.0
    busy_ms: float = 0.0
    ttfa: list[float] = field(default_factory=list)


def _mean(bounds: tuple[float, float]) -> float:
    return (bounds[0] + bounds[1]) / 2


def cost_per_audio_ms(sessions: int, overload: float) -> float:
    """Engine ms per ms of reply audio so that the offered load is ``overload`` x capacity."""
    reply_ms = _mean((float(CHUNKS[0]), float(CHUNKS[1]))) * _mean(CHUNK_MS)
    return overload * (_mean(USER_MS) + reply_ms) / (sessions * reply_ms)


def _scheduler(policy: Policy, config: SchedulerConfig) -> Scheduler:
    if policy is Policy.EDF:
        return DeadlineScheduler(config)
    return RoundRobinScheduler(aware=policy is Policy.RR_AWARE)


def _run(
    policy: Policy, n: int, overload: float, seed: int, duration_ms: float, config: SchedulerConfig
) -> _Run:
    """Run one closed-loop simulation and return its raw tallies."""
    k = cost_per_audio_ms(n, overload)
    aware = policy is not Policy.RR
    sched = _scheduler(policy, config)
    sessions = [SimSession(f"s{i:02d}", random.Random(seed * 1000 + i)) for i in range(n)]
    by_id = {s.sid: s for s in sessions}
    for s in sessions:
        s.phase_end = s.rng.uniform(*USER_MS)
    queue: list[WorkItem] = []
    outputs: dict[int, float] = {}
    running: WorkItem | None = None
    run_started = run_end = 0.0
    next_id = 0
    out = _Run(duration_ms)

    def start_reply(s: SimSession, now: float) -> None:
        out.turns += 1
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
                    out.barge_ins += 1
                    s.epoch += 1  # barge-in: everything older is stale
                    if aware and running is not None and running.session_id == s.sid:
                        out.aborted_ms += now - run_started
                        running = None
                    to_user(s, now)
                elif short > 0 and (s.chunks_left or s.queued):
                    out.underrun_ms += short
                    if not s.in_gap:
                        out.underruns += 1
                    s.in_gap = True
                elif short > 0:
                    out.replies += 1
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
                    out.ttfa.append(now - owner.turn_end)
                    owner.phase = Phase.PLAY
                owner.buffered += outputs[running.item_id]
            else:
                out.stale_ms += running.est_cost_ms
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
                    out.stale_scheduled += 1
                run_started, run_end = now, now + running.est_cost_ms
        if running is not None:
            out.busy_ms += TICK_MS
        now += TICK_MS
    out.unserved = sum(
        1
        for s in sessions
        if s.phase is Phase.WAIT and now - s.turn_end > config.first_audio_target_ms
    )
    out.waiting_at_end_ms = sum(now - s.turn_end for s in sessions if s.phase is Phase.WAIT)
    return out


def _summarise(
    policy: Policy, n: int, overload: float, runs: list[_Run], config: SchedulerConfig
) -> SimResult:
    ttfa = [t for r in runs for t in r.ttfa]
    target = config.first_audio_target_ms
    late = sum(1 for t in ttfa if t > target)
    unserved = sum(r.unserved for r in runs)
    turns = sum(r.turns for r in runs)
    waited = sum(ttfa) + sum(r.waiting_at_end_ms + r.underrun_ms for r in runs)
    return SimResult(
        policy=policy.value,
        sessions=n,
        overload=overload,
        seeds=len(runs),
        duration_s=sum(r.duration_ms for r in runs) / 1000,
        turns=turns,
        replies=sum(r.replies for r in runs),
        barge_ins=sum(r.barge_ins for r in runs),
        underruns=sum(r.underruns for r in runs),
        underrun_ms=round(sum(r.underrun_ms for r in runs), 1),
        first_audio_target_ms=target,
        first_audio_misses=late + unserved,
        first_audio_unserved=unserved,
        ttfa_p50_ms=round(statistics.median(ttfa), 1) if ttfa else float("nan"),
        ttfa_p95_ms=round(pct(ttfa, 0.95), 1),
        ttfa_mean_ms=round(statistics.fmean(ttfa), 1) if ttfa else float("nan"),
        wait_per_turn_ms=round(waited / turns, 1) if turns else float("nan"),
        stale_scheduled=sum(r.stale_scheduled for r in runs),
        stale_compute_ms=round(sum(r.stale_ms for r in runs), 1),
        aborted_in_flight_ms=round(sum(r.aborted_ms for r in runs), 1),
        engine_busy=round(statistics.fmean(r.busy_ms / r.duration_ms for r in runs), 3),
    )


def simulate(
    policy: Policy,
    n: int,
    overload: float,
    seed: int = 1,
    duration_ms: float = 120_000.0,
    config: SchedulerConfig | None = None,
) -> SimResult:
    """Run one closed-loop simulation (one seed) and return its figures."""
    return simulate_seeds(policy, n, overload, (seed,), duration_ms, config)


def simulate_seeds(
    policy: Policy,
    n: int,
    overload: float,
    seeds: tuple[int, ...] | range,
    duration_ms: float,
    config: SchedulerConfig | None = None,
) -> SimResult:
    """One cell: the figures of ``seeds`` runs, summed (counts) or pooled (TTFA)."""
    config = config or SchedulerConfig()  # the server's defaults
    runs = [_run(policy, n, overload, seed, duration_ms, config) for seed in seeds]
    return _summarise(policy, n, overload, runs, config)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def provenance() -> dict[str, Any]:
    """Machine, commit and the hashes of the two source files the figures depend on (the
    working tree may differ from the commit)."""
    sources = {}
    for name in SOURCES:
        path = Path(name)
        if path.exists():
            sources[name] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    dirty = git("status", "--porcelain", "--", *SOURCES)
    return {
        "machine": this_machine().to_dict(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "sources_modified_since_commit": bool(dirty),
        "source_sha256": sources,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/scheduler_sim.json"))
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=None,
        help="EDF's aging bound (default: the server's, SchedulerConfig.max_wait_ms)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    config = SchedulerConfig()
    if args.max_wait_ms is not None:
        config = replace(config, max_wait_ms=args.max_wait_ms)
    sizes = (8,) if args.quick else SIZES
    seeds = range(1, 2 if args.quick else args.seeds + 1)
    duration = 20_000.0 if args.quick else 180_000.0
    print(f"machine: {this_machine().describe()} (simulated time: figures do not depend on it)")
    print(
        f"seeds {list(seeds)} x {duration / 1000:g} s per cell; first-audio target"
        f" {config.first_audio_target_ms:g} ms; aging bound {config.max_wait_ms:g} ms"
    )
    print(
        f"{'N':>3} {'load':>4} {'policy':<18} {'underruns':>9} {'gap s':>7} {'FA miss':>7}"
        f" {'turns':>5} {'ttfa p50':>8} {'ttfa p95':>8} {'wait/turn':>9}"
        f" {'stale sched':>11} {'stale ms':>8} {'aborted ms':>10}"
    )
    rows: list[SimResult] = []
    for n in sizes:
        for overload in LOADS:
            cell: dict[str, SimResult] = {}
            for policy in Policy:
                r = simulate_seeds(policy, n, overload, seeds, duration, config)
                cell[policy.value] = r
                rows.append(r)
                print(
                    f"{n:>3} {overload:>4} {policy.value:<18} {r.underruns:>9}"
                    f" {r.underrun_ms / 1000:>7.1f} {r.first_audio_misses:>7} {r.turns:>5}"
                    f" {r.ttfa_p50_ms:>8.0f} {r.ttfa_p95_ms:>8.0f} {r.wait_per_turn_ms:>9.0f}"
                    f" {r.stale_scheduled:>11}"
                    f" {r.stale_compute_ms:>8.0f} {r.aborted_in_flight_ms:>10.0f}"
                )
            edf = cell[Policy.EDF.value]
            for other in (Policy.RR, Policy.RR_AWARE):
                o = cell[other.value]
                print(
                    f"    EDF/{other.value}: underruns {_ratio(edf.underruns, o.underruns)},"
                    f" gap time {_ratio(edf.underrun_ms, o.underrun_ms)},"
                    f" first-audio misses {_ratio(edf.first_audio_misses, o.first_audio_misses)}"
                )
    result = {
        "benchmark": "scheduler_sim",
        "command": " ".join([".venv/bin/python -m benchmarks.scheduler_sim", *argv]),
        "pipeline": (
            "simulated time (no sleeping, deterministic for a seed); the real DeadlineScheduler"
            " and RoundRobinScheduler from server/scheduling/scheduler.py pick the work"
        ),
        **provenance(),
        "scenario": {
            "tick_ms": TICK_MS,
            "user_ms": USER_MS,
            "chunks_per_reply": CHUNKS,
            "chunk_audio_ms": CHUNK_MS,
            "barge_in_share": BARGE_P,
            "budget_ms": BUDGET_MS,
            "first_audio_target_ms": config.first_audio_target_ms,
            "max_wait_ms": config.max_wait_ms,
            "seeds": list(seeds),
            "duration_s_per_seed": duration / 1000,
        },
        "wall_s": round(time.monotonic() - started, 1),
        "rows": [asdict(r) for r in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
