"""How far the server's UDP sockets fall behind with many peers, on each event loop.

Every WebRTC peer has its own UDP socket on the server. The load is the soak test's
(tests/server/test_soak.py), which CI failed three times on asyncio's loop: one bystander
asks for reply after reply (tone replies, events only), while batches of peers receiving
128x128 video (every other one) connect from a subprocess that is then SIGKILLed, so the next
batch handshakes beside one the reaper has not closed yet. Every 250 ms the benchmark reads
the server's sockets from ``/proc/<pid>/net/udp``: the bytes queued in the kernel, not yet read
by the loop (``rx_queue``), and the datagrams dropped on full queues. It reports the largest
queue per sample (max, p90, p50), the drops, and what the bystander got: its replies'
statuses, and whether it kept its connection. The loops take turns, run by run.

Run: ``.venv/bin/python -m benchmarks.udp_backlog`` (``--quick``: one run each, fewer cycles).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import source_commit
from benchmarks.netns import isolate
from client.cli import ClientPeer
from server.eventloop import EVENT_LOOPS
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.peers import keep_talking
from tests.support.server_process import TONE_PIPELINE, ServerProcess, tone_env
from tests.support.vanishing_clients import VanishingClients

SAMPLE_S = 0.25
READY_TIMEOUT_S = 60.0
AVATAR_SIDE = 128  # px, as the soak


def udp_queues(pid: int) -> tuple[int, int]:
    """The largest receive queue (bytes) among the UDP sockets of ``pid``'s network
    namespace, and the datagrams they dropped so far."""
    lines = Path(f"/proc/{pid}/net/udp").read_text().splitlines()[1:]
    fields = [line.split() for line in lines]
    queued = max((int(f[4].split(":")[1], 16) for f in fields), default=0)
    return queued, sum(int(f[-1]) for f in fields)


async def sample(pid: int, into: list[tuple[int, int]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            into.append(udp_queues(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)


async def one_run(loop: str, batch: int, cycles: int) -> dict[str, Any]:
    """The soak's load on a server running ``loop``; its sockets' queues and the bystander."""
    max_sessions = 1 + 2 * batch
    server = ServerProcess(
        {
            "pipeline.factory": TONE_PIPELINE,
            "server.event_loop": loop,
            "transport.max_sessions": str(max_sessions),
            "transport.dead_peer_timeout_s": "2",
            "session.resume_window_s": "0",
            "transport.connect_timeout_s": "10",
            "transport.session_rate_per_min": "0",
            "transport.video_width": str(AVATAR_SIDE),
            "transport.video_height": str(AVATAR_SIDE),
        },
        env=tone_env(1500, sentences=2),
    ).start()
    samples: list[tuple[int, int]] = []
    replies: list[str] = []
    stop = asyncio.Event()
    bystander = ClientPeer(server.url, video=False)
    started = time.monotonic()
    try:
        assert server.proc is not None
        sampler = asyncio.create_task(sample(server.proc.pid, samples, stop))
        await bystander.connect()
        talker = asyncio.create_task(keep_talking(bystander, replies, stop))
        vanished = 0
        while vanished < cycles and not talker.done():
            await server.wait_health(
                lambda h: h["sessions"] + batch <= max_sessions, 30.0, "room", interval=0.2
            )
            clients = await VanishingClients.launch(server.url, batch, 2, READY_TIMEOUT_S)
            await clients.kill()
            vanished += batch
        stop.set()
        lost = None
        try:
            await asyncio.wait_for(talker, 40)
        except Exception as exc:  # the bystander's reply never finished: its connection went
            lost = f"{type(exc).__name__}: {exc}"[:200]
        await sampler
        connection = bystander.pc.connectionState
    finally:
        stop.set()
        await bystander.close()
        server.stop()
    queued = sorted(q for q, _ in samples)
    return {
        "event_loop": loop,
        "batch": batch,
        "vanished": vanished,
        "seconds": round(time.monotonic() - started, 1),
        "samples": len(queued),
        "udp_queue_bytes_max": queued[-1] if queued else None,
        "udp_queue_bytes_p90": queued[int(0.9 * len(queued))] if queued else None,
        "udp_queue_bytes_p50": statistics.median(queued) if queued else None,
        "udp_drops": samples[-1][1] if samples else None,
        "bystander_replies": {s: replies.count(s) for s in sorted(set(replies))},
        "bystander_connection_at_end": connection,
        "bystander_lost": lost,
    }


async def run(rounds: int, batch: int, cycles: int, loops: list[str]) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    runs = []
    for i in range(rounds):
        for loop in loops:
            result = await one_run(loop, batch, cycles)
            print(f"round {i + 1}", json.dumps(result), flush=True)
            runs.append(result)
    summary = {}
    for loop in loops:
        mine = [r for r in runs if r["event_loop"] == loop]
        summary[loop] = {
            "udp_queue_bytes_max_median": statistics.median(r["udp_queue_bytes_max"] for r in mine),
            "udp_queue_bytes_p50_median": statistics.median(r["udp_queue_bytes_p50"] for r in mine),
            "udp_drops": [r["udp_drops"] for r in mine],
            "bystander_lost": sum(r["bystander_lost"] is not None for r in mine),
            "runs": len(mine),
        }
    return {"summary": summary, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="UDP socket backlog under many peers, by loop")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=15, help="peers per vanishing batch")
    parser.add_argument("--cycles", type=int, default=150, help="peers that vanish per run")
    parser.add_argument("--loops", default=",".join(EVENT_LOOPS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/udp_backlog.json"))
    args = parser.parse_args(argv)
    isolate("benchmarks.udp_backlog", argv)
    machine = this_machine()
    print(f"machine: {machine.describe()}")
    rounds, cycles = (1, 30) if args.quick else (args.rounds, args.cycles)
    loops = [name for name in args.loops.split(",") if name]
    results = {
        "machine": machine.to_dict(),
        "machine_line": machine.describe(),
        "commit": source_commit(),
        **asyncio.run(run(rounds, args.batch, cycles, loops)),
    }
    print(json.dumps(results["summary"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
