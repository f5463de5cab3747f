"""Resume time: milliseconds from the resume ``POST /offer`` to the first audio frame the client
receives on its new connection.

    .venv/bin/python -m benchmarks.resume_bench [--count 10] [--quick] [--out PATH]

The path users run: a server process with the embedded models (Whisper, vLLM, Piper) and the
avatar video on, and the project's aiortc client (``client.cli.ClientPeer``) asking for audio
and video. The client types a question, and while the reply plays its network path dies: its UDP
sockets are aborted (tests/support/peers.py ``cut_network``), so the server hears nothing but
silence. 0.3 s later the client resumes with its token (``ClientPeer.resume``): a new peer
connection, the offer posted with ``resume_token``. The figure is the time from that POST to
the first audio frame received on the new connection (RTP audio; silence counts, but mid-reply
it is the reply). A new question follows every third resume, so the resumes fall in replies.
Also reported: the session id stays the same, and ``session.created`` says ``resumed``.

``--quick`` (CI's smoke run): the tone pipeline of tests/support (no models), no video, 2
resumes; its figures are not for reporting. JSON (machine, ISA flags, commit) to
``benchmarks/results/resume.json`` (``--out``). Exit code 0 only if every resume succeeded and
the server exited cleanly. Bounded: each resume waits at most ``RESUME_TIMEOUT_S``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import pct, stamped
from benchmarks.netns import isolate
from client.cli import ClientPeer
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.peers import cut_network
from tests.support.server_process import ROOT, TONE_PIPELINE, ServerProcess, tone_env

RESULT = ROOT / "benchmarks" / "results" / "resume.json"
DEFAULT_COUNT = 10
QUICK_COUNT = 2
RESUME_TIMEOUT_S = 15.0
QUESTIONS = (
    "Tell me about the sea and the ships that sail on it.",
    "What should I see first in Paris?",
    "How do bees make honey?",
    "Tell me a short story about a fox.",
)


async def measure(url: str, count: int, video: bool) -> dict[str, Any]:
    client = ClientPeer(url, video=video)
    samples: list[float] = []
    failures: list[str] = []
    try:
        await client.connect(timeout=RESUME_TIMEOUT_S)
        session_id = client.session_id
        await client.wait_event("session.created")
        for i in range(count):
            if i % 3 == 0:
                question = QUESTIONS[(i // 3) % len(QUESTIONS)]
                client.send({"type": "conversation.item.create", "text": question})
                await client.wait_event(
                    "response.audio_transcript.delta", timeout=60, after=len(client.events)
                )
            await asyncio.sleep(1.5)  # the reply plays
            cut_network(client.pc)
            await asyncio.sleep(0.3)
            marker = len(client.events)
            try:
                took = await client.resume(RESUME_TIMEOUT_S)
                created = await client.wait_event("session.created", after=marker)
                if not created.get("resumed") or client.session_id != session_id:
                    raise RuntimeError(f"not resumed: {created}")
                samples.append(took * 1000)
                print(f"resume {i + 1}: {took * 1000:.1f} ms", flush=True)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                print(f"resume {i + 1} failed: {exc}", flush=True)
                break
    finally:
        await client.close()
    return {
        "samples_ms": [round(v, 1) for v in samples],
        "median_ms": round(statistics.median(samples), 1) if samples else None,
        "p95_ms": round(pct(samples, 0.95), 1) if samples else None,
        "min_ms": round(min(samples), 1) if samples else None,
        "max_ms": round(max(samples), 1) if samples else None,
        "failures": failures,
    }


async def run(count: int, quick: bool) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    settings = {"server.log_level": "WARNING", "transport.session_burst": "1000"}
    env: dict[str, str] = {}
    if quick:
        settings.update({"pipeline.factory": TONE_PIPELINE, "transport.video": "false"})
        env = tone_env(2000, sentences=4)
    server = ServerProcess(settings, env=env).start(timeout=240)
    try:
        results = await measure(server.url, count, video=not quick)
    finally:
        code = server.stop()
    results["server_exit_code"] = code
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.resume_bench", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--count", type=int, help=f"resumes (default {DEFAULT_COUNT})")
    parser.add_argument("--quick", action="store_true", help="tone pipeline, 2 resumes")
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON goes")
    args = parser.parse_args(argv)
    count = args.count or (QUICK_COUNT if args.quick else DEFAULT_COUNT)
    isolate("benchmarks.resume_bench", argv)
    print(f"machine: {this_machine().describe()}", flush=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "what": "ms from the resume POST /offer to the first audio frame on the new connection",
        "quick": args.quick,
        "count": count,
        "pipeline": "tone (tests/support)" if args.quick else "embedded models, video on",
    }
    results.update(asyncio.run(run(count, args.quick)))
    results["wall_s"] = round(time.monotonic() - started, 1)
    stamped(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"resume -> first audio: median {results['median_ms']} ms, p95 {results['p95_ms']} ms, "
        f"{len(results['samples_ms'])} of {count}; wrote {args.out}"
    )
    if results["failures"] or results["server_exit_code"] != 0:
        print(f"failed: {results['failures']}, server exit {results['server_exit_code']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
