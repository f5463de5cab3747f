"""A client without echo cancellation, on the path users run: real models, a real WebRTC peer.

The client's microphone hears its speaker: everything it receives comes back into the
microphone 50-150 ms later at -10 dB (tests/support/echo.py; every other trial through a
small room's reverb). Each trial asks a typed question and lets the spoken reply play to its
end (a **self-interruption** is a reply stopped, a **pause** one the echo paused), then asks
another and speaks a real interruption over its echo (espeak-ng: "Wait, stop.", ...): it
must stop the reply; the reaction as the client hears it is the interruption's onset sent ->
the first silent frame received. The same trials run on a server with the echo handling
(``vad.echo_cancellation`` on) and on one without it (the baseline).

Run: ``.venv/bin/python -m benchmarks.echo_bench`` (``--quick``: 4 trials a server;
``--slow-server``: the servers in the slow profile, scripts/slow.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import pct, stamped
from benchmarks.interjection_bench import (
    INTERRUPTIONS,
    QUESTIONS,
    audible,
    events_after,
    idle,
    loud_now,
    onset_s,
    silence_reaction,
)
from benchmarks.netns import isolate
from client.cli import ClientPeer
from server.rtc.settings import pin_host_addresses
from tests.support.echo import EchoingMic
from tests.support.server_process import ServerProcess
from tests.support.speech import speak

SLOW = Path(__file__).resolve().parents[1] / "scripts" / "slow.sh"
DELAYS_MS = (50, 75, 100, 125, 150)
GAIN_DB = -10.0


async def full_reply(peer: ClientPeer, question: str) -> dict[str, Any]:
    """Ask ``question`` and let the reply play to its end over its own echo."""
    mark, asked = len(peer.events), time.monotonic()
    peer.say(question)
    done = await peer.wait_event("response.done", timeout=180, after=mark)
    await asyncio.sleep(0.5)
    return {
        "status": done.get("status"),
        "self_interrupted": bool(events_after(peer, mark, "conversation.item.truncated"))
        or done.get("status") == "cancelled",
        "pauses": len(events_after(peer, mark, "output_audio_buffer.paused")),
        "paused_after_s": [  # from the question
            round(t - asked, 2)
            for t, e in peer.events[mark:]
            if e.get("type") == "output_audio_buffer.paused"
        ],
        "resumed": [
            e.get("reason") for e in events_after(peer, mark, "output_audio_buffer.resumed")
        ],
        "speech_starts": len(events_after(peer, mark, "input_audio_buffer.speech_started")),
    }


async def interrupted_reply(
    server: ServerProcess, peer: ClientPeer, question: str, words: str, rng: random.Random
) -> dict[str, Any]:
    """Ask ``question`` and speak ``words`` over its reply (and the reply's echo)."""
    assert isinstance(peer.mic, EchoingMic)
    sound = speak(words)
    mark, frames_at = len(peer.events), len(peer.audio)
    peer.say(question)
    await peer.wait_event("response.audio_transcript.delta", timeout=180, after=mark)
    await audible(peer, frames_at)
    await asyncio.sleep(rng.uniform(0.4, 1.0))
    await loud_now(peer)
    if events_after(peer, mark, "response.done"):
        await idle(server, peer)
        return {"skipped": "the reply ended (or was stopped) before the interruption"}
    clips, sent_after = len(peer.mic.clip_sent_at), len(peer.audio)
    peer.mic.play(sound)
    done = await peer.wait_event("response.done", timeout=120, after=mark)
    await asyncio.sleep(0.3)
    onset = peer.mic.clip_sent_at[clips] + onset_s(sound)
    truncated = events_after(peer, mark, "conversation.item.truncated")
    said = [t for t, e in peer.events[mark:] if e.get("type") == "output_audio_buffer.paused"]
    stopped = bool(truncated) or done.get("status") == "cancelled"
    reaction = None
    if stopped:
        reaction = silence_reaction(peer.audio[sent_after:], onset, said[0] if said else onset)
    resumed = events_after(peer, mark, "output_audio_buffer.resumed")
    judged = ((await asyncio.to_thread(server.session, peer.session_id)) or {}).get(
        "interjections", {}
    )
    await idle(server, peer)
    return {
        "words": words,
        "stopped": stopped,
        "client_reaction_ms": reaction,
        "paused": bool(said),
        "resumed": resumed[0].get("reason") if resumed else None,
        "words_judged": (judged.get("words") or [None])[-1],
    }


async def run_server(
    cancel_echo: bool, trials: int, slow_server: bool, settings: dict[str, str] | None = None
) -> dict[str, Any]:
    """The trials on one server (echo cancellation on or off; ``settings``: more of its
    settings, dotted names)."""
    rng = random.Random(11)
    server = ServerProcess(
        {
            "server.debug_endpoints": "true",
            "transport.connect_timeout_s": "60",
            "transport.max_sessions": "2",
            "vad.echo_cancellation": str(cancel_echo).lower(),
            **(settings or {}),
        },
        wrapper=[str(SLOW), "--"] if slow_server else None,
    ).start(timeout=400)
    outcomes: list[dict[str, Any]] = []
    try:
        for n in range(trials):
            delay, reverb = DELAYS_MS[n % len(DELAYS_MS)], n % 2 == 1
            mic = EchoingMic(delay, GAIN_DB, reverb)
            peer = ClientPeer(server.url, video=True, mic=mic)
            mic.received = peer.audio
            await peer.connect(timeout=60)
            try:
                whole = await full_reply(peer, QUESTIONS[n % len(QUESTIONS)])
                if whole["pauses"]:  # what the recogniser made of the voice over the reply
                    view = (await asyncio.to_thread(server.session, peer.session_id)) or {}
                    whole["words_heard"] = view.get("interjections", {}).get("words", [])
                await idle(server, peer)
                question = QUESTIONS[(n + 1) % len(QUESTIONS)]
                real = await interrupted_reply(
                    server, peer, question, INTERRUPTIONS[n % len(INTERRUPTIONS)], rng
                )
                echo = ((await asyncio.to_thread(server.session, peer.session_id)) or {}).get(
                    "echo", {}
                )
            finally:
                await peer.close()
            delays = sorted(mic.delays_ms[len(mic.delays_ms) // 4 :])  # once settled
            found = {
                "delay_ms": delay,
                "reverb": reverb,
                "measured_delay_p50_ms": round(delays[len(delays) // 2], 1) if delays else None,
                "full_reply": whole,
                "interruption": real,
                "echo": echo,
            }
            outcomes.append(found)
            print(json.dumps(found), flush=True)
    finally:
        code = server.stop()
    return summarize(outcomes, code)


def summarize(outcomes: list[dict[str, Any]], code: int) -> dict[str, Any]:
    replies = [o["full_reply"] for o in outcomes]
    real = [o["interruption"] for o in outcomes if "skipped" not in o["interruption"]]
    reactions = [r["client_reaction_ms"] for r in real if r["client_reaction_ms"] is not None]
    removed = [o["echo"].get("removed_db") for o in outcomes]
    removed_db = [r for r in removed if r is not None]
    return {
        "replies": len(replies),
        "self_interruptions": sum(r["self_interrupted"] for r in replies),
        "replies_paused_by_echo": sum(r["pauses"] > 0 for r in replies),
        "pauses": sum(r["pauses"] for r in replies),
        "real_interruptions": len(real),
        "real_interruptions_stopped": sum(r["stopped"] for r in real),
        "real_interruptions_skipped": len(outcomes) - len(real),
        "client_reaction_p50_ms": round(statistics.median(reactions), 1) if reactions else None,
        "client_reaction_p95_ms": round(pct(reactions, 0.95), 1) if reactions else None,
        "echo_removed_p50_db": round(statistics.median(removed_db), 1) if removed_db else None,
        "trials": outcomes,
        "server_exit_code": code,
    }


async def run(
    quick: bool, slow_server: bool, baseline: bool = True, settings: dict[str, str] | None = None
) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    trials = 4 if quick else 10
    started = time.monotonic()
    results = {
        "slow_server": slow_server,
        "echo_gain_db": GAIN_DB,
        "echo_delays_ms": list(DELAYS_MS),
        "settings": settings or {},
        "with_echo_cancellation": await run_server(True, trials, slow_server, settings),
    }
    if baseline:
        results["baseline_without"] = await run_server(False, trials, slow_server, settings)
    results["seconds"] = round(time.monotonic() - started, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="replies over their own echo, with and without")
    parser.add_argument("--quick", action="store_true", help="4 trials a server")
    parser.add_argument("--slow-server", action="store_true", help="the servers in slow.sh")
    parser.add_argument("--no-baseline", action="store_true", help="only the echo handling")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a server setting"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/echo.json"))
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set takes NAME=VALUE")
    isolate("benchmarks.echo_bench", argv)
    settings = dict(item.split("=", 1) for item in args.set)
    results = asyncio.run(run(args.quick, args.slow_server, not args.no_baseline, settings))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2))
    brief = {
        mode: {k: v for k, v in results[mode].items() if k != "trials"}
        for mode in ("with_echo_cancellation", "baseline_without")
        if mode in results
    }
    print(json.dumps(brief, indent=2))
    print(f"wrote {args.out}")
    codes = [results[mode]["server_exit_code"] for mode in brief]
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
