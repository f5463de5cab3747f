"""What one hostile session costs the server, with and without its events and media budgets
(security finding "no rate on events or media").

    python -m benchmarks.session_budget [--seconds 10] [--only events|packets|jumps]

For each attack, a real aiortc peer against a real server process (listening only: the real
turn detector hears the audio), once with the budgets off (``session.max_events_per_s`` and
``transport.max_media_packets_per_s`` 0: as before them) and with the defaults
(``throttled``: ``session.flood_s`` 0, so the throttled session is measured, not ended; and
``default``: ended after ``session.flood_s``), beside a baseline (a session whose microphone
sends as a browser does):

- events: invalid events as fast as the peer's channel takes them; how many were answered;
- packets: each 20 ms microphone packet sent 40 times over (2,000 packets a second);
- jumps: the microphone's packets at their pace, each one's timestamp 980 ms after the last
  one's end; how much concealment and silence the server made.

The server's CPU time over the attack (all its threads, from /proc) is the cost. The result
goes to ``benchmarks/results/session_budget.json``. Runs in its own network namespace
(loopback only) where it can.
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

import aiohttp

from benchmarks import source_commit
from benchmarks.netns import isolate
from client.cli import ClientPeer
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.rtp_abuse import FloodingSender, JumpingSender, RewritingSender
from tests.support.server_process import ServerProcess, metric_value

RESULT = Path("benchmarks/results/session_budget.json")
ATTACKS = ("events", "packets", "jumps")
BUDGETS = {
    "off": {
        "session.max_events_per_s": "0",
        "transport.max_media_packets_per_s": "0",
        "session.flood_s": "0",
    },
    "throttled": {"session.flood_s": "0"},
    "default": {},
}
OWN_QUEUE_BYTES = 64 * 1024  # the attacker lets its own channel drain past this
FLOOD_COPIES = 40
JUMP_MS = 980.0


def cpu_s(pid: int) -> float:
    """CPU time (s) process ``pid`` has used, all its threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def metrics(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        return await resp.text()


async def flood_events(peer: ClientPeer, until: float) -> int:
    sent = 0
    message = json.dumps({"type": "no.such.event"})
    while time.monotonic() < until and peer.channel.readyState == "open":
        if peer.channel.bufferedAmount > OWN_QUEUE_BYTES:
            await asyncio.sleep(0.002)
            continue
        for _ in range(64):
            peer.channel.send(message)
        sent += 64
        await asyncio.sleep(0)
    return sent


async def attack(url: str, pid: int, kind: str, seconds: float) -> dict[str, Any]:
    """One attack of ``kind`` for ``seconds``: what was sent and answered, the server's CPU."""
    peer = ClientPeer(url, video=False, audio=kind != "events")
    await peer.connect(15.0)
    await peer.wait_event("session.created", 10.0)
    await asyncio.sleep(1.0)  # the connection settled
    n = len(peer.events)
    before, started = cpu_s(pid), time.monotonic()
    until = started + seconds
    sender: RewritingSender | None = None
    result: dict[str, Any] = {}
    if kind == "events":
        result["sent"] = await flood_events(peer, until)
    elif kind == "baseline":
        await asyncio.sleep(seconds)
        result["sent"] = 0
    else:
        (rtp,) = [t.sender for t in peer.pc.getTransceivers() if t.kind == "audio"]
        sender = (
            FloodingSender(rtp, FLOOD_COPIES) if kind == "packets" else JumpingSender(rtp, JUMP_MS)
        )
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        sender.stop()
        result["sent"] = sender.sent
    await asyncio.sleep(1.0)  # what the server still had queued
    result["cpu_s"] = round(cpu_s(pid) - before, 2)
    result["cores"] = round(result["cpu_s"] / (time.monotonic() - started), 3)
    result["answers"] = sum(e["type"] == "error" for _, e in peer.events[n:])
    text = await metrics(url)
    result["synthesised_s"] = round(
        metric_value(text, "avatar_inbound_audio_lost_seconds_total"), 1
    )
    result["rate_limited"] = {
        k: metric_value(text, "avatar_session_rate_limited_total", f'kind="{k}"')
        for k in ("events", "media", "jump")
    }
    await peer.close()
    return result


def run_one(kind: str, budget: str, seconds: float) -> dict[str, Any]:
    settings = {"pipeline.factory": "", "transport.video": "false", **BUDGETS[budget]}
    server = ServerProcess(settings).start()
    assert server.proc is not None
    try:
        result = asyncio.run(attack(server.url, server.proc.pid, kind, seconds))
    finally:
        server.stop()
    result["ended"] = " flood (over " in server.log()  # the server ended the session
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.session_budget")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each attack")
    parser.add_argument("--only", choices=ATTACKS, help="one attack only")
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON goes")
    parser.add_argument(
        "--quick", action="store_true", help="2 s per attack: a smoke run, not for reporting"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 2.0
    isolate("benchmarks.session_budget", argv)
    pin_host_addresses(["127.0.0.1"])
    results: dict[str, Any] = {"baseline": run_one("baseline", "default", args.seconds)}
    print("baseline (one session's microphone)", json.dumps(results["baseline"]), flush=True)
    for kind in [args.only] if args.only else ATTACKS:
        for budget in BUDGETS:
            results[f"{kind}/{budget}"] = run_one(kind, budget, args.seconds)
            print(kind, budget, json.dumps(results[f"{kind}/{budget}"]), flush=True)
    out = {
        "machine": this_machine().describe(),
        "commit": source_commit(),
        "seconds": args.seconds,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
