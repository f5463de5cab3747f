"""Capacity with 1 vs 2 worker processes: the most sessions conversing at once, cleanly.

For each worker count a real server runs (``server.workers`` = 1 is the plain single process;
2 is the supervisor, its router and two workers) with the deterministic tone pipeline. Real
aiortc peers (audio + video, one reply after another, the transport benchmark's
``talking_session``) connect in steps of 2 sessions.

A step passes a lateness limit when every peer connected, no reply underran and the worst
session's outbound audio frame lateness p99 is within the limit. Two limits are reported:

- 5 ms, the rule of ``benchmarks.transport_bench.bench_capacity`` ("clean");
- 40 ms, two audio frames: what a client's adaptive jitter buffer hides.

The capacity of a run at a limit is the largest step that, with every smaller step, passed it.
Tone replies are ready at once, so the playback buffer stays full. An overloaded server
therefore shows up as late frames, not as underruns.

Worker counts alternate within each repeat (1, 2, 1, 2, ...), so a change in the machine's
other load touches both; the medians over ``--repeats`` are reported with each run's figures.
The peers run in this process, on the same machine, and take CPU from the server too. Runs in
a lo-only network namespace. ``--smoke`` runs one short step per worker count and writes
nothing unless ``--out`` is given.

    .venv/bin/python -m benchmarks.workers_bench [--repeats 3] [--seconds 10] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import largest_passing, stamped
from benchmarks.netns import isolate
from benchmarks.transport_bench import cpu_seconds, server_pids, settled, talking_session
from server.fleet.router import worker_of
from server.rtc.settings import pin_host_addresses
from tests.support.server_process import TONE_PIPELINE, ServerProcess

LIMITS_MS = (5.0, 40.0)  # audio frame lateness p99 limits a step may pass
STOP_P99_MS = 250.0  # a step this late ends the run: bigger steps only get worse
OUT = Path("benchmarks/results/workers.json")


async def step(server: ServerProcess, sessions: int, seconds: float) -> dict[str, Any]:
    """``sessions`` peers conversing for ``seconds``; the server's pacing and CPU figures."""
    pids = server_pids(server)
    cpu0, t0 = sum(cpu_seconds(p) for p in pids), time.monotonic()
    results = await asyncio.gather(
        *(talking_session(server, seconds, True) for _ in range(sessions)), return_exceptions=True
    )
    wall = time.monotonic() - t0
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    stats = [r for r in results if isinstance(r, dict)]
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    p99 = [float(s["frame_lateness_ms"]["p99"]) for s in stats]
    owners: dict[str, int] = {}  # sessions per worker (none for a single process)
    for s in stats:
        index = worker_of(str(s["session_id"]))
        if index is not None:
            owners[f"w{index}"] = owners.get(f"w{index}", 0) + 1
    return {
        "sessions": sessions,
        "seconds": round(wall, 1),
        "replies": sum(int(s["replies"]) for s in stats),
        "underruns": sum(int(s["underruns"]) for s in stats),
        "frame_lateness_p99_ms": round(max(p99), 2) if p99 else None,
        "server_cpu_percent_of_core": round(100 * cpu / wall, 1),
        "load_average_1m": os.getloadavg()[0],
        "sessions_by_worker": owners,
        "errors": errors,
    }


def passes(result: dict[str, Any], limit_ms: float) -> bool:
    lateness = result["frame_lateness_p99_ms"]
    return (
        not result["errors"]
        and result["underruns"] == 0
        and lateness is not None
        and lateness <= limit_ms
    )


def capacity(steps: list[dict[str, Any]], limit_ms: float) -> int:
    """The largest step that, with every smaller step, passed ``limit_ms``."""
    return largest_passing(steps, lambda result: passes(result, limit_ms))


async def measure(workers: int, steps: tuple[int, ...], seconds: float) -> dict[str, Any]:
    """One capacity run with ``workers`` worker processes."""
    server = ServerProcess(
        {
            "pipeline.factory": TONE_PIPELINE,
            "server.workers": str(workers),
            "transport.max_sessions": "64",  # per worker: capacity is set by quality, not a cap
            "server.debug_endpoints": "true",
            "server.log_level": "WARNING",
            "transport.session_rate_per_min": "0",  # all peers come from one address
        },
        env={"TONE_PIPELINE_MS": "4000", "TONE_PIPELINE_SENTENCES": "2"},
    ).start()
    done: list[dict[str, Any]] = []
    try:
        idle = await settled(server)
        for n in steps:
            result = await step(server, n, seconds)
            done.append(result)
            spread = ", ".join(f"{k} {v}" for k, v in sorted(result["sessions_by_worker"].items()))
            print(
                f"  workers {workers}, {n:>2} sessions: p99 {result['frame_lateness_p99_ms']} ms, "
                f"underruns {result['underruns']}, "
                f"server cpu {result['server_cpu_percent_of_core']} % of a core, "
                f"load {result['load_average_1m']:.1f}"
                + (f", on {spread}" if spread else "")
                + (f", errors {len(result['errors'])}" if result["errors"] else ""),
                flush=True,
            )
            with contextlib.suppress(TimeoutError):  # the next step then starts beside them
                await server.wait_sessions(0, 30)  # the peers of this step are gone
            if not passes(result, STOP_P99_MS):
                break
    finally:
        code = server.stop()
    return {
        "workers": workers,
        "capacity": {f"{limit:g}ms": capacity(done, limit) for limit in LIMITS_MS},
        "idle_cpu_percent_before": idle,
        "server_exit_code": code,
        "steps": done,
    }


def summarise(runs: list[dict[str, Any]], worker_counts: tuple[int, ...]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for workers in worker_counts:
        mine = [r for r in runs if r["workers"] == workers]
        entry: dict[str, Any] = {}
        for limit in LIMITS_MS:
            key = f"{limit:g}ms"
            values = [r["capacity"][key] for r in mine]
            entry[f"capacity_{key}_median"] = statistics.median(values)
            entry[f"capacity_{key}_runs"] = values
        by_step: dict[int, list[float]] = {}
        for r in mine:
            for s in r["steps"]:
                if s["frame_lateness_p99_ms"] is not None:
                    by_step.setdefault(s["sessions"], []).append(s["frame_lateness_p99_ms"])
        entry["p99_ms_median_by_sessions"] = {
            str(n): round(statistics.median(v), 1) for n, v in sorted(by_step.items())
        }
        summary[str(workers)] = entry
    return summary


async def run(
    worker_counts: tuple[int, ...], repeats: int, steps: tuple[int, ...], seconds: float
) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    runs: list[dict[str, Any]] = []
    for repeat in range(repeats):
        for workers in worker_counts:
            print(f"repeat {repeat + 1}/{repeats}, {workers} worker(s):", flush=True)
            runs.append({"repeat": repeat, **await measure(workers, steps, seconds)})
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "rule": {
            "pass": "every peer connected, 0 underruns, worst session's audio frame lateness "
            "p99 within the limit",
            "limits_ms": list(LIMITS_MS),
            "session": "audio+video, tone replies of 2 x 4 s one after another",
            "seconds_per_step": seconds,
            "steps": list(steps),
        },
        "summary": summarise(runs, worker_counts),
        "runs": runs,
    }


def table(results: dict[str, Any]) -> str:
    keys = [f"{limit:g}ms" for limit in LIMITS_MS]
    rows = [
        "workers | "
        + " | ".join(f"sessions, p99 <= {k}: median (runs)" for k in keys)
        + " | p99 ms by sessions (median)"
    ]
    rows.append("---|" + "---|" * len(keys) + "---")
    for workers, s in results["summary"].items():
        cells = [f"{s[f'capacity_{k}_median']} ({s[f'capacity_{k}_runs']})" for k in keys]
        curve = ", ".join(f"{n}: {v}" for n, v in s["p99_ms_median_by_sessions"].items())
        rows.append(f"{workers} | " + " | ".join(cells) + f" | {curve}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="capacity with 1 vs 2 worker processes")
    parser.add_argument("--smoke", action="store_true", help="one short step per worker count")
    parser.add_argument("--repeats", type=int, default=3, help="runs per worker count")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each step (s)")
    parser.add_argument("--max-sessions", type=int, default=12, help="largest step")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare")
    parser.add_argument("--out", type=Path, help=f"results file (default {OUT}; none for smoke)")
    args = parser.parse_args(argv)
    isolate("benchmarks.workers_bench", argv)
    counts = tuple(int(x) for x in args.workers.split(","))
    steps: tuple[int, ...]
    if args.smoke:
        steps, repeats, seconds = (2,), 1, 4.0
    else:
        steps = tuple(range(2, args.max_sessions + 1, 2))
        repeats, seconds = args.repeats, args.seconds
    results = asyncio.run(run(counts, repeats, steps, seconds))
    results["command"] = " ".join([".venv/bin/python -m benchmarks.workers_bench", *argv])
    print(table(results))
    out = args.out or (None if args.smoke else OUT)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(stamped(results), indent=2))
        print(f"wrote {out}")
    return 0 if all(r["server_exit_code"] == 0 for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
