"""Every user gets in: connect-speak-drop cycles on a server of two session slots.

    .venv/bin/python -m benchmarks.admission_bench [--cycles 40] [--quick] [--out PATH]

The path users run: a server process with the embedded models and the avatar video on,
``transport.max_sessions=2``, and the project's aiortc client. Each cycle a new client
connects (``POST /offer``), asks a question aloud (the joe voice through its microphone), waits
for the reply's first audio, and leaves without ``DELETE``: odd cycles close their peer
connection (a tab closed), even ones vanish (their UDP sockets aborted: an app killed, a phone
out of coverage), as people leave. The clients follow one another at once, as reloads do.

Reported: the offers refused (503) and how long each cycle took, the server's live and
detached sessions (``/healthz``) after each cycle and 9 s after the last, its RSS, and whether
the last client's resume still works at the end. Exit code 0 only if no offer was refused.
``--quick`` (CI's smoke run): the tone pipeline of tests/support (no models), no video, 4
cycles; its figures are not for reporting.
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

import aiohttp
import numpy as np

from benchmarks import stamped
from benchmarks.netns import isolate
from client.cli import ClientPeer
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.peers import cut_network
from tests.support.server_process import ROOT, TONE_PIPELINE, ServerProcess, tone_env

RESULT = ROOT / "benchmarks" / "results" / "admission.json"
QUESTIONS = ("What is the capital of France?", "How many legs does a spider have?")
REPLY_TIMEOUT_S = 60.0


async def health(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as resp:
        return dict(await resp.json())


def question(i: int) -> np.ndarray:
    from models.tts import OnnxVoiceTts

    return OnnxVoiceTts().synthesize(QUESTIONS[i % len(QUESTIONS)]).pcm


async def cycle(url: str, i: int, video: bool, speech: np.ndarray | None) -> ClientPeer:
    """One client: connect, ask, hear the reply start, leave without a word."""
    client = ClientPeer(url, video=video)
    await client.connect(timeout=30)
    await client.wait_event("session.created")
    marker = len(client.events)
    if speech is not None:
        client.mic.play(np.concatenate([np.zeros(14_400, np.int16), speech]))
    else:
        client.send({"type": "conversation.item.create", "text": QUESTIONS[i % 2]})
    await client.wait_event("response.audio_transcript.delta", REPLY_TIMEOUT_S, after=marker)
    await asyncio.sleep(1.0)  # a little of the reply is heard
    if i % 2:
        await client.pc.close()
    else:
        cut_network(client.pc)
    return client


async def measure(url: str, cycles: int, video: bool, spoken: bool) -> dict[str, Any]:
    speech = [question(i) for i in range(len(QUESTIONS))] if spoken else None
    refused: list[int] = []
    rows: list[dict[str, Any]] = []
    clients: list[ClientPeer] = []
    for i in range(cycles):
        started = time.monotonic()
        try:
            clients.append(await cycle(url, i, video, None if speech is None else speech[i % 2]))
        except RuntimeError as exc:
            if "503" not in str(exc):
                raise
            refused.append(i + 1)
            print(f"cycle {i + 1}: refused ({exc})", flush=True)
        seen = await health(url)
        row = {
            "cycle": i + 1,
            "s": round(time.monotonic() - started, 2),
            "live": seen["sessions"],
            "detached": seen["detached_sessions"],
            "rss_mb": round(seen["rss_bytes"] / 1e6, 1),
        }
        rows.append(row)
        print(row, flush=True)
    await asyncio.sleep(9)
    after = await health(url)
    last = clients[-1] if clients else None  # its conversation still waits
    resumed = False
    if last is not None:
        try:
            await last.resume(15)
            resumed = True
        except Exception as exc:
            print(f"the last client's resume: {exc}", flush=True)
    for client in clients:
        await client.close(delete=False)
    return {
        "refused_cycles": refused,
        "cycles": rows,
        "cycle_s_p50": round(statistics.median(r["s"] for r in rows), 2),
        "after_9_s": {
            "live": after["sessions"],
            "detached": after["detached_sessions"],
            "rss_mb": round(after["rss_bytes"] / 1e6, 1),
        },
        "last_client_resumed": resumed,
    }


async def run(cycles: int, quick: bool) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    settings = {
        "server.log_level": "WARNING",
        "transport.session_burst": "1000",
        "transport.max_sessions": "2",
    }
    env: dict[str, str] = {}
    if quick:
        settings.update({"pipeline.factory": TONE_PIPELINE, "transport.video": "false"})
        env = tone_env(2000, sentences=2)
    server = ServerProcess(settings, env=env).start(timeout=240)
    try:
        results = await measure(server.url, cycles, video=not quick, spoken=not quick)
    finally:
        code = server.stop()
    results["server_exit_code"] = code
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.admission_bench", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--cycles", type=int, help="connect-speak-drop cycles (default 40)")
    parser.add_argument("--quick", action="store_true", help="tone pipeline, 4 cycles")
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON goes")
    args = parser.parse_args(argv)
    cycles = args.cycles or (4 if args.quick else 40)
    isolate("benchmarks.admission_bench", argv)
    print(f"machine: {this_machine().describe()}", flush=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "what": "connect-speak-drop cycles with transport.max_sessions=2: refusals, live and "
        "detached sessions, RSS",
        "quick": args.quick,
        "pipeline": "tone (tests/support)" if args.quick else "embedded models, video on",
    }
    results.update(asyncio.run(run(cycles, args.quick)))
    results["wall_s"] = round(time.monotonic() - started, 1)
    stamped(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"{cycles} cycles: refused {results['refused_cycles']}, after 9 s "
        f"{results['after_9_s']}, last client resumed: {results['last_client_resumed']}; "
        f"wrote {args.out}"
    )
    ok = not results["refused_cycles"] and results["last_client_resumed"]
    return 0 if ok and results["server_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
