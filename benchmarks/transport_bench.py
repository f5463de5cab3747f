"""Transport benchmarks against a real server process with real aiortc peers on loopback.

- barge-in reaction (server side): first voiced input frame's arrival -> first silent outbound
  frame, over scripted interruptions of a playing reply;
- false barge-ins on noise: white and pink noise at -40 and -30 dBFS while the agent speaks;
- outbound pacing: lateness of audio frames against the 20 ms grid, 1 and 4 sessions, with
  underruns while replies play;
- server CPU per connected audio+video session (process CPU seconds per second of media).

Replies come from the deterministic tone pipeline (tests/support), so the figures measure the
transport and the runtime, not the models. Run:
``.venv/bin/python -m benchmarks.transport_bench`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import pct, stamped
from benchmarks.netns import isolate
from client.cli import ClientPeer
from server.rtc.settings import pin_host_addresses
from tests.support.server_process import TONE_PIPELINE, ServerProcess
from tests.support.speech import rms, silence, speak, voiced_span_ms

QUESTION = "Hello there. Can you tell me something about the weather today?"
INTERRUPT = "Sorry, wait a moment, I have another question."
CLK_TCK = os.sysconf("SC_CLK_TCK")


def session_stats(server: ServerProcess, session_id: str | None) -> dict[str, Any]:
    """The server's figures of one session, live or closed (KeyError if it has none)."""
    found = server.session(session_id)
    if found is None:
        raise KeyError(session_id)
    return found


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def server_pids(server: ServerProcess) -> list[int]:
    """The server's processes: the supervisor and its workers (or the one server)."""
    assert server.proc is not None
    return [server.proc.pid, *server.worker_pids().values()]


async def settled(server: ServerProcess, timeout: float = 60.0) -> float:
    """Wait until the idle server's processes use < 5 % of a core (start-up work, e.g. model
    warm-up threads, is over); returns the last idle figure (% of a core)."""
    pids = server_pids(server)
    deadline = time.monotonic() + timeout
    while True:
        cpu0 = sum(cpu_seconds(p) for p in pids)
        await asyncio.sleep(1.0)
        idle = 100 * (sum(cpu_seconds(p) for p in pids) - cpu0)
        if idle < 5.0 or time.monotonic() > deadline:
            return round(idle, 1)


def noise(kind: str, dbfs: float, seconds: float, seed: int) -> npt.NDArray[np.int16]:
    rng = np.random.default_rng(seed)
    n = int(seconds * 48_000)
    x = rng.standard_normal(n)
    if kind == "pink":  # Voss-McCartney-like: sum of octave-spaced held random values
        x = np.zeros(n)
        for octave in range(12):
            step = 2**octave
            held = rng.standard_normal(n // step + 1)
            x += np.repeat(held, step)[:n]
    x = x / np.sqrt(np.mean(x**2)) * (10 ** (dbfs / 20)) * 32767
    out: npt.NDArray[np.int16] = np.clip(x, -32768, 32767).astype(np.int16)
    return out


async def audible_since(peer: ClientPeer, since: float, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(t > since and rms(p) > 1000 for t, p in peer.audio[-10:]):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("reply never became audible")


async def barge_in_session(server: ServerProcess, cycles: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    peer = ClientPeer(server.url, video=False)
    await peer.connect()
    try:
        question, interrupt = speak(QUESTION), speak(INTERRUPT)
        onset_ms = voiced_span_ms(interrupt)[0]
        client_ms: list[float] = []
        mark = len(peer.events)
        peer.mic.play(np.concatenate([silence(300), question]))
        done = 0
        while done < cycles:
            await peer.wait_event("response.audio_transcript.delta", timeout=20, after=mark)
            await audible_since(peer, time.monotonic() - 0.05)
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            mark = len(peer.events)
            clips = len(peer.mic.clip_sent_at)
            peer.mic.play(interrupt)
            await peer.wait_event("conversation.item.truncated", timeout=10, after=mark)
            await asyncio.sleep(0.5)
            # client side: speech onset sent -> the reply audio received goes silent
            onset = peer.mic.clip_sent_at[clips] + onset_ms / 1000
            silent = [t for t, p in peer.audio if t > onset and rms(p) < 50]
            if silent:
                client_ms.append((silent[0] - onset) * 1000)
            done += 1
        stats = session_stats(server, peer.session_id)
        stats["client_reactions_ms"] = client_ms
        return stats
    finally:
        await peer.close()


async def bench_barge_in(server: ServerProcess, sessions: int, cycles: int) -> dict[str, Any]:
    stats = await asyncio.gather(
        *(barge_in_session(server, cycles, seed) for seed in range(sessions))
    )
    reactions = [r for s in stats for r in s["barge_in_reactions_ms"]]
    confirmed = [r for s in stats for r in s["barge_in_confirmed_reactions_ms"]]
    client = [r for s in stats for r in s["client_reactions_ms"]]
    return {
        "confirmed_p50_ms": round(statistics.median(confirmed), 1),
        "confirmed_p95_ms": round(pct(confirmed, 0.95), 1),
        "client_p50_ms": round(float(statistics.median(client)), 1) if client else None,
        "client_p95_ms": round(float(pct(client, 0.95)), 1) if client else None,
        "interruptions": len(reactions),
        "sessions": sessions,
        "p50_ms": round(statistics.median(reactions), 1),
        "p95_ms": round(pct(reactions, 0.95), 1),
        "max_ms": round(max(reactions), 1),
        "reactions_ms": [round(r, 1) for r in reactions],
    }


async def keep_talking(peer: ClientPeer, seconds: float) -> int:
    """Ask for one reply after another for ``seconds``; returns how many finished."""
    end = time.monotonic() + seconds
    replies = 0
    while time.monotonic() < end:
        mark = len(peer.events)
        peer.send({"type": "conversation.item.create", "text": "Tell me more."})
        try:
            await peer.wait_event("response.done", timeout=end - time.monotonic(), after=mark)
        except TimeoutError:
            break
        replies += 1
    return replies


async def noise_session(
    server: ServerProcess, kind: str, dbfs: float, seconds: float
) -> tuple[int, int]:
    """Speech starts, and replies paused (then resumed: no voice), over ``seconds`` of noise."""
    peer = ClientPeer(server.url, video=False)
    await peer.connect()
    try:
        peer.mic.play(noise(kind, dbfs, seconds, seed=int(-dbfs)))
        await keep_talking(peer, seconds)  # the agent talks over the noise
        stats = session_stats(server, peer.session_id)
        judged = stats.get("interjections", {})
        paused = judged.get("resumed", 0) + judged.get("interrupted", 0)
        return int(stats["speech_starts"]), int(paused)
    finally:
        await peer.close()


async def bench_noise(server: ServerProcess, seconds: float) -> dict[str, Any]:
    cases = [("white", -40.0), ("white", -30.0), ("pink", -40.0), ("pink", -30.0)]
    found = await asyncio.gather(*(noise_session(server, k, d, seconds) for k, d in cases))
    names = [f"{k} {d:.0f} dBFS" for k, d in cases]
    return {
        "seconds_each": seconds,
        "false_speech_starts": {n: s for n, (s, _) in zip(names, found, strict=True)},
        "total": sum(s for s, _ in found),
        "replies_paused": {n: p for n, (_, p) in zip(names, found, strict=True)},
        "paused_total": sum(p for _, p in found),
    }


async def talking_session(server: ServerProcess, seconds: float, video: bool) -> dict[str, Any]:
    peer = ClientPeer(server.url, video=video)
    await peer.connect()
    try:
        replies = await keep_talking(peer, seconds)
        stats = session_stats(server, peer.session_id)
        stats["replies"] = replies
        stats["video_frames_received"] = peer.video_count
        return stats
    finally:
        await peer.close()


async def bench_pacing(server: ServerProcess, sessions: int, seconds: float) -> dict[str, Any]:
    assert server.proc is not None
    cpu0, t0 = cpu_seconds(server.proc.pid), time.monotonic()
    stats = await asyncio.gather(*(talking_session(server, seconds, True) for _ in range(sessions)))
    cpu = cpu_seconds(server.proc.pid) - cpu0
    wall = time.monotonic() - t0
    p99 = [s["frame_lateness_ms"]["p99"] for s in stats]
    return {
        "sessions": sessions,
        "seconds": round(wall, 1),
        "replies": sum(s["replies"] for s in stats),
        "frame_lateness_p50_ms": round(max(s["frame_lateness_ms"]["p50"] for s in stats), 2),
        "frame_lateness_p99_ms": round(max(p99), 2),
        "frame_lateness_max_ms": round(max(s["frame_lateness_ms"]["max"] for s in stats), 2),
        "underruns": sum(s["underruns"] for s in stats),
        "server_cpu_percent_of_core": round(100 * cpu / wall, 1),
        "cpu_percent_per_session": round(100 * cpu / wall / sessions, 1),
    }


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def bench_memory(server: ServerProcess, sessions: int) -> dict[str, Any]:
    """Server RSS with ``sessions`` audio+video sessions connected vs none (MB)."""
    assert server.proc is not None
    await asyncio.sleep(1)
    before = rss_mb(server.proc.pid)
    peers = [ClientPeer(server.url, video=True) for _ in range(sessions)]
    try:
        for peer in peers:
            await peer.connect()
        for peer in peers:
            peer.send({"type": "conversation.item.create", "text": "Hello."})
        await asyncio.sleep(3)
        during = rss_mb(server.proc.pid)
    finally:
        for peer in peers:
            await peer.close()
    await asyncio.sleep(1)
    after = rss_mb(server.proc.pid)
    return {
        "sessions": sessions,
        "rss_idle_mb": round(before, 1),
        "rss_connected_mb": round(during, 1),
        "per_session_mb": round((during - before) / sessions, 1),
        "rss_after_close_mb": round(after, 1),
    }


async def bench_capacity(
    server: ServerProcess, steps: tuple[int, ...], seconds: float
) -> dict[str, Any]:
    """The most sessions talking at once (audio+video, replies playing) with zero underruns
    and audio frame lateness p99 <= 5 ms; steps stop at the first that fails."""
    results = []
    capacity = 0
    for n in steps:
        step = await bench_pacing(server, n, seconds)
        clean = step["underruns"] == 0 and step["frame_lateness_p99_ms"] <= 5.0
        results.append({**step, "clean": clean})
        print(
            f"capacity step {n}: underruns {step['underruns']}, "
            f"p99 {step['frame_lateness_p99_ms']} ms, cpu {step['server_cpu_percent_of_core']} %"
        )
        if not clean:
            break
        capacity = n
    return {"sessions_clean": capacity, "tried": list(steps[: len(results)]), "steps": results}


async def bench_idle_cpu(server: ServerProcess, seconds: float) -> float:
    assert server.proc is not None
    cpu0, t0 = cpu_seconds(server.proc.pid), time.monotonic()
    await asyncio.sleep(seconds)
    return round(100 * (cpu_seconds(server.proc.pid) - cpu0) / (time.monotonic() - t0), 2)


async def run(quick: bool) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    server = ServerProcess(
        {
            "pipeline.factory": TONE_PIPELINE,
            "transport.max_sessions": "8",
            "server.debug_endpoints": "true",
            "server.log_level": "WARNING",
        },
        env={"TONE_PIPELINE_MS": "4000", "TONE_PIPELINE_SENTENCES": "2"},
    ).start()
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    }
    try:
        # the avatar's sprites warm up in the background after ready: measure once that is over
        results["settled_idle_cpu_percent"] = await settled(server, 120.0)
        results["idle_server_cpu_percent"] = await bench_idle_cpu(server, 2 if quick else 5)
        results["barge_in"] = await bench_barge_in(server, 1 if quick else 2, 3 if quick else 12)
        print("barge-in:", {k: v for k, v in results["barge_in"].items() if k != "reactions_ms"})
        results["noise"] = await bench_noise(server, 5 if quick else 60)
        print("noise:", results["noise"])
        for n in (1, 4):
            results[f"pacing_{n}"] = await bench_pacing(server, n, 6 if quick else 20)
            print(f"pacing {n}:", results[f"pacing_{n}"])
        results["memory"] = await bench_memory(server, 2 if quick else 4)
        print("memory:", results["memory"])
        results["capacity"] = await bench_capacity(
            server, (2, 4) if quick else (2, 4, 6, 8), 6 if quick else 15
        )
        print("capacity:", {k: v for k, v in results["capacity"].items() if k != "steps"})
    finally:
        code = server.stop()
        results["server_exit_code"] = code
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="transport benchmarks")
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/transport.json"))
    args = parser.parse_args(argv)
    isolate("benchmarks.transport_bench", argv)
    results = asyncio.run(run(args.quick))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2))
    print(f"wrote {args.out}")
    return 0 if results["server_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
