"""RSS of the server under the unacknowledging-peer attack (security issue item 3).

    python -m benchmarks.unacked_peer [--seconds 60] [--interval 5]

A real aiortc peer (events only: no audio, no video) connects to a real server process, stops
sending SCTP SACKs and then sends bad events as fast as its own queue drains: each one an
unknown ``type`` just under ``transport.max_event_bytes``, so every ``error`` answer quotes a
client value. The server's answers are never acknowledged. When the server closes the session,
the attacker connects again (a new session) and goes on. The server's RSS (``VmRSS``) is
sampled every ``--interval`` s; the result goes to ``benchmarks/results/unacked_peer.json``.
Runs in its own network namespace (loopback only) where it can.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import source_commit
from benchmarks.netns import isolate
from client.cli import ClientPeer
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.hostile_peers import stop_acknowledging
from tests.support.server_process import ServerProcess

RESULT = Path("benchmarks/results/unacked_peer.json")
MAX_EVENT_BYTES = 16_384
BAD_TYPE_CHARS = MAX_EVENT_BYTES - 64  # the whole message stays under the limit
ATTACKER_QUEUE_BYTES = 256 * 1024  # the attacker waits while its own channel holds this much
BATCH = 16  # bad events sent between two looks at the attacker's own queue
CONNECT_RETRY_S = 1.0


def rss_mb(pid: int) -> float:
    """Resident set size (MB) of process ``pid``, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def attack_once(url: str, until: float, counts: dict[str, int]) -> None:
    """One session: connect, stop acknowledging, send bad events until the channel closes or
    ``until`` (monotonic s)."""
    peer = ClientPeer(url, video=False, audio=False)
    try:
        await peer.connect(15.0)
        counts["sessions"] += 1
        stop_acknowledging(peer)
        message = json.dumps({"type": "x" * BAD_TYPE_CHARS})
        while time.monotonic() < until and peer.channel.readyState == "open":
            if peer.pc.connectionState in ("failed", "closed"):
                break
            if peer.channel.bufferedAmount > ATTACKER_QUEUE_BYTES:
                await asyncio.sleep(0.005)
                continue
            for _ in range(BATCH):
                peer.channel.send(message)
                counts["sent"] += 1
            await asyncio.sleep(0)
    except (RuntimeError, OSError, TimeoutError) as exc:  # refused (rate limit, full) or slow
        counts["refused"] += 1
        print(f"connect: {exc}", file=sys.stderr)
        await asyncio.sleep(CONNECT_RETRY_S)
    finally:
        await peer.close()


def sample_rss(
    pid: int, started: float, seconds: float, interval: float, counts: dict[str, int]
) -> list[tuple[float, float]]:
    """(s since ``started``, RSS MB) at 0, ``interval``, 2 ``interval``... up to ``seconds``;
    on a thread of its own, so a busy event loop does not delay a sample."""
    samples: list[tuple[float, float]] = []
    for k in range(int(seconds // interval) + 1):
        time.sleep(max(0.0, started + k * interval - time.monotonic()))
        samples.append((round(time.monotonic() - started, 1), round(rss_mb(pid), 1)))
        print(f"t={samples[-1][0]:5.1f} s  RSS {samples[-1][1]:7.1f} MB  {counts}", flush=True)
    return samples


async def attack(url: str, seconds: float, interval: float, pid: int) -> dict[str, Any]:
    started = time.monotonic()
    until = started + seconds
    counts = {"sessions": 0, "sent": 0, "refused": 0}
    sampler = asyncio.create_task(
        asyncio.to_thread(sample_rss, pid, started, seconds, interval, counts)
    )
    while time.monotonic() < until:
        await attack_once(url, until, counts)
    return {"counts": counts, "rss_mb": await sampler}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.unacked_peer")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the attack")
    parser.add_argument("--interval", type=float, default=5.0, help="RSS sampling period (s)")
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON goes")
    args = parser.parse_args(argv)
    isolate("benchmarks.unacked_peer", argv)
    pin_host_addresses(["127.0.0.1"])
    server = ServerProcess(
        {
            "pipeline.factory": "",
            "transport.video": "false",
            "transport.max_event_bytes": str(MAX_EVENT_BYTES),
            "transport.session_burst": "1000",
        }
    ).start()
    assert server.proc is not None
    try:
        result = asyncio.run(attack(server.url, args.seconds, args.interval, server.proc.pid))
    finally:
        code = server.stop()
    closed = server.log().count("closing the session")
    result.update(
        {
            "machine": this_machine().describe(),
            "commit": source_commit(),
            "seconds": args.seconds,
            "interval_s": args.interval,
            "server_exit": code,
            "sessions_closed_at_cap": closed,
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
