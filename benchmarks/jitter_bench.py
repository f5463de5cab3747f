"""How late the user's voice reaches the server, by inbound jitter buffer, with packets lost.

Two aiortc peers on loopback (tests/support/lossy_audio.py): the client sends its microphone's
20 ms frames in real time, and the server's track delivers them decoded. For each frame, the
delay from its packet's sending to its arrival at the track (what the turn detector and the
barge-in wait for, before any of their own work). Each scenario runs with the server's buffer
(``arrival``: server/rtc/jitter.py, every packet on arrival, and the server's decoder,
server/rtc/opus.py) and with aiortc's own, releasing after one packet (``aiortc``: the
server's until 2026-12-05), in turn:

- ``none``: no packet lost;
- ``one_lost``: the 40th packet lost (0.8 s in);
- ``random_2pc``: 2 % of the packets lost at random (seeded);
- ``reordered``: every 50th packet sent after the one that follows it.

Reported per scenario and buffer: the delay's median, p90 and largest, the frames received,
the silence the inbound path puts in for frames that skipped (ms), and the frames the
server's decoder made for lost packets (ms; this client sends no FEC copies, so they are
extrapolated).

Run: ``.venv/bin/python -m benchmarks.jitter_bench`` (``--quick``: fewer frames).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import pct, stamped
from benchmarks.netns import isolate
from server.machine import this_machine
from server.rtc.settings import tune_audio_receive
from tests.support.lossy_audio import Heard, Lose, Tune, aiortc_buffer, hear_over_loss

BUFFERS: dict[str, Tune] = {"arrival": tune_audio_receive, "aiortc": aiortc_buffer}
SEED = 7


def scenarios(frames: int) -> dict[str, tuple[Lose, frozenset[int]]]:
    """Name -> (the packets lost, the packets sent after their successor)."""
    rng = random.Random(SEED)
    random_lost = {n for n in range(1, frames * 2) if rng.random() < 0.02}
    return {
        "none": (lambda n: False, frozenset()),
        "one_lost": (lambda n: n == 40, frozenset()),
        "random_2pc": (random_lost.__contains__, frozenset()),
        "reordered": (lambda n: False, frozenset(range(50, frames * 2, 50))),
    }


def figures(heard: Heard) -> dict[str, Any]:
    delays = heard.delays_ms[5:]  # the first frames: the peers still settling
    return {
        "delay_ms_p50": round(statistics.median(delays), 1),
        "delay_ms_p90": round(pct(delays, 0.9), 1),
        "delay_ms_max": round(max(delays), 1),
        "frames": len(heard.delays_ms),
        "silence_filled_ms": heard.filled_ms,
        "concealed_ms": heard.concealed_ms,
    }


async def run(frames: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, (lose, late) in scenarios(frames).items():
        for buffer, tune in BUFFERS.items():
            heard = await hear_over_loss(tune, lose, frames, late)
            results.setdefault(name, {})[buffer] = figures(heard)
            print(name, buffer, json.dumps(results[name][buffer]), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="inbound audio delay by jitter buffer")
    parser.add_argument("--quick", action="store_true", help="100 frames a run, not 250")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/jitter.json"))
    args = parser.parse_args(argv)
    isolate("benchmarks.jitter_bench", argv)
    machine_line = this_machine().describe()
    print(f"machine: {machine_line}")
    scenarios_run = asyncio.run(run(100 if args.quick else 250))
    results = stamped({"machine_line": machine_line, "scenarios": scenarios_run})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
