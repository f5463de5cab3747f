"""Is the first conversation after ``ready`` as quick as the tenth? (issue: readiness means ready)

Starts the server on the embedded models with video on (the avatar's sprites warm up in the
background at the lowest priority), and as soon as ``/healthz`` answers, runs ten conversations
one after another, each a new peer receiving audio and video that asks one spoken question.
Reports each conversation's voice-to-voice latency (the server's ``response.timings``: end of
turn -> first reply audio) and whether the warm-up was still running during it.

Run: ``.venv/bin/python -m benchmarks.first_after_ready`` (``--quick``: three conversations).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import stamped
from benchmarks.netns import isolate
from benchmarks.voice_bench import ask, synthesize_questions
from client.cli import ClientPeer
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.server_process import ServerProcess

QUESTION = "What is the capital of France?"
WARMED = re.compile(r"avatar warmed up in ([0-9.]+) s")


async def run(conversations: int) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    (question,) = synthesize_questions([QUESTION])
    server = ServerProcess(
        {"server.debug_endpoints": "true", "transport.connect_timeout_s": "60"}
    ).start(timeout=300)
    ready = time.monotonic()
    rows: list[dict[str, Any]] = []
    try:
        for n in range(1, conversations + 1):
            peer = ClientPeer(server.url, video=True)
            await peer.connect(timeout=30)
            try:
                turn = await ask(peer, question, timeout=120)
            finally:
                await peer.close()
            warmed = WARMED.search(server.log())
            row = {
                "conversation": n,
                "started_after_ready_s": round(time.monotonic() - ready, 1),
                "voice_to_voice_ms": turn["voice_to_voice_ms"],
                "asr_final_ms": turn["asr_final_ms"],
                "llm_first_token_ms": turn["llm_first_token_ms"],
                "first_tts_ms": turn["first_tts_ms"],
                "prompt_tokens": turn.get("prompt_tokens"),
                "cached_tokens": turn.get("cached_tokens"),
                "warm_up_done": warmed is not None,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        server.stop()
    warmed = WARMED.search(server.log())
    first, last = rows[0]["voice_to_voice_ms"], rows[-1]["voice_to_voice_ms"]
    return {
        "machine": this_machine().to_dict(),
        "pipeline": "the embedded default models, 512x512 video",
        "conversations": rows,
        "avatar_warm_up_s": float(warmed.group(1)) if warmed else None,
        "first_voice_to_voice_ms": first,
        "last_voice_to_voice_ms": last,
        "ratio_first_vs_last": round(first / last, 2) if first and last else None,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/first_after_ready.json")
    )
    args = parser.parse_args(argv)
    isolate("benchmarks.first_after_ready", argv)
    print(f"machine: {this_machine().describe()}")
    results = asyncio.run(run(3 if args.quick else 10))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2))
    print(
        f"first {results['first_voice_to_voice_ms']} ms, last {results['last_voice_to_voice_ms']}"
        f" ms (ratio {results['ratio_first_vs_last']}); avatar warm-up"
        f" {results['avatar_warm_up_s']} s; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
