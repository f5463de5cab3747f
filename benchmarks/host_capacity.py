"""Sessions one host holds before its replies underrun, on the path users run: the embedded
models (default settings), audio and 512x512 video, real aiortc peers asking spoken questions.

First one session asks one question, not counted: the first conversation after ready meets
cold caches and the avatar's background warm-up. Then steps of 1, 2, 3, ... sessions: each
step connects that many peers, and each peer asks
``--questions`` spoken questions one after another, all peers at the same time. A step passes
when every reply came and completed and none underran (``avatar_playback_underruns`` on the
server). The host's capacity is the largest step that passed, with every smaller one; the run
stops at the first step that failed (or after ``--max``). Each step also reports the
voice-to-voice p50 (server and client), the gaps over 40 ms in the received reply audio and the
loop lag p99, and the run reports what the server's own calibration estimated at start (the
``capacity`` of ``/healthz``, which a proxy's load-balancer agent works from).

The peers run in this process on the same machine, and their video decoding takes CPU from
the server unless a profile keeps them apart. ``--slow-server`` runs the server alone in the
slow profile (``scripts/slow.sh``: AVX-512 off, 0.5 CPUs), its peers on the rest of the
machine, as a user's clients would be; ``--one-core`` runs the server on core 0 alone with the
AVX2 caps (``scripts/slow.sh --one-core``) and the peers on the other cores: a host's capacity
per AVX2 core. Runs in a lo-only network namespace.

    .venv/bin/python -m benchmarks.host_capacity [--slow-server | --one-core] [--max 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import largest_passing, source_commit
from benchmarks.netns import isolate
from benchmarks.realtime_bench import SLOW, conversing
from benchmarks.voice_bench import QUESTIONS, synthesize_questions
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.server_process import ServerProcess


def passed(step: dict[str, Any], questions: int) -> bool:
    """Every reply came, completed, and none underran."""
    return bool(step.get("replies") == step["sessions"] * questions and step["underruns"] == 0)


PROFILES = {  # the server's wrapper, and what it means
    "as-is": ([], "as is: the server and its peers share every core"),
    "slow": ([str(SLOW), "--"], "server in the slow profile (scripts/slow.sh: 0.5 CPUs, AVX2)"),
    "one-core": (
        [str(SLOW), "--one-core", "--"],
        "server alone on core 0 with the AVX2 caps (scripts/slow.sh --one-core), peers elsewhere",
    ),
}


async def run(profile: str, most: int, per_session: int) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    clips = synthesize_questions(QUESTIONS)
    wrapper, described = PROFILES[profile]
    server = ServerProcess(
        {"transport.connect_timeout_s": "60", "transport.max_sessions": str(most)},
        wrapper=wrapper or None,
    ).start(timeout=400)
    steps: list[dict[str, Any]] = []
    try:
        health = await asyncio.to_thread(server.health)
        results: dict[str, Any] = {"profile": described, "calibration": health.get("calibration")}
        warm_up = await conversing(server, [[clips[-1]]])  # not counted
        results["warm_up"] = {k: v for k, v in warm_up.items() if k != "turns"}
        for n in range(1, most + 1):
            # each session its own questions (rotating through the set)
            asked = [
                [clips[(k * per_session + q) % len(clips)] for q in range(per_session)]
                for k in range(n)
            ]
            started = time.monotonic()
            try:
                step = {"sessions": n, **await conversing(server, asked)}
            except TimeoutError as exc:  # a reply that never came: the step failed
                step = {"sessions": n, "replies": None, "underruns": None, "error": str(exc)}
            step["wall_s"] = round(time.monotonic() - started, 1)
            step["passed"] = passed(step, per_session)
            steps.append(step)
            shown = {k: v for k, v in step.items() if k != "turns"}
            print(json.dumps(shown), flush=True)
            if not step["passed"]:
                break
    finally:
        server.stop()
    results["steps"] = steps
    results["capacity_sessions"] = largest_passing(steps, lambda step: bool(step["passed"]))
    results["capacity_is_a_floor"] = bool(steps and steps[-1]["passed"])  # --max reached
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="sessions per host before underruns")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--slow-server", action="store_true", help="server in the slow profile")
    chosen.add_argument("--one-core", action="store_true", help="server alone on core 0 (AVX2)")
    parser.add_argument("--max", type=int, default=6, help="most sessions tried")
    parser.add_argument("--questions", type=int, default=2, help="questions per session")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/host_capacity.json"))
    args = parser.parse_args(argv)
    isolate("benchmarks.host_capacity", argv)
    profile = "slow" if args.slow_server else "one-core" if args.one_core else "as-is"
    if profile == "one-core":  # the peers (this process) keep off the server's core
        others = os.sched_getaffinity(0) - {0}
        if not others:
            parser.error("--one-core needs a second core for the peers")
        os.sched_setaffinity(0, others)
    print(f"machine: {this_machine().describe()}")
    started = time.monotonic()
    results = asyncio.run(run(profile, args.max, args.questions))
    results["machine"] = this_machine().to_dict()
    results["commit"] = source_commit()
    results["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    floor = " (at least: the most tried)" if results["capacity_is_a_floor"] else ""
    print(f"sessions before underruns: {results['capacity_sessions']}{floor}")
    print(f"calibration's estimate: {(results['calibration'] or {}).get('capacity')}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
