"""The user talking over the avatar's echo, offline: is the user heard, and what does the echo
gate learn from it?

A client without echo cancellation: the avatar's reply (the joe voice, about 18 s) comes back
into its microphone 100 ms later at -10 dB through a small room, with the microphone's hiss.
The user talks over it twice: "Wait, stop, tell me about Rome instead." at 20 % of the reply
and "No, hold on a second." at 65 %. The audio goes through the server's echo path as a call
would (what was sent in the order the audio track sent it, each 20 ms heard frame cleaned:
WebRTC's AEC3 and the residual echo gate) and the detector's voice view through the turn
detector (webrtcvad + Silero, the server's settings). Each seed is a new synthesis of both.

Reported per arm: how often the detector's speech start came within 500 ms of each talk-over,
and how often at all within it; starts elsewhere (the echo taken for the user); the highest
echo gain the gate learnt, and for how long it was above -5 dB (the echo's is -10 dB; above
it the gate hides from the detector a user as loud as the avatar). Arms, on the same audio:

- **gate** (default): frames marked as the user talking over the avatar are not learnt as
  the echo (``echo_gate.USER_ABOVE_DB``);
- **learns_user** (``--ablate user-frames``): every frame the canceller took 10 dB or more
  from is learnt as the echo (before 2026-12-05).

Run: ``.venv/bin/python -m benchmarks.talk_over_bench [--seeds 30]``; no server, no network.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import at_mic_level, write_summarised
from models.echo import WebRtcEchoCanceller
from models.tts import OnnxVoiceTts
from server.pipeline.echo import EchoPath
from server.pipeline.echo_gate import ResidualEchoGate
from server.pipeline.turn_detector import VadEventKind
from tests.support.echo import PCM, detector, echo_of, through, voice_events

DELAY_MS = 100
REPLY = (
    "The capital of France is Paris, a city on the river Seine. It has many museums, old "
    "bridges and a famous tower made of iron, built for a fair long ago. People walk along the "
    "river in the evening, and the cafes stay open late. In spring the parks are full of "
    "flowers, and in winter the streets shine with lights."
)
TALK_OVERS = (("Wait, stop, tell me about Rome instead.", 0.2), ("No, hold on a second.", 0.65))
ARMS: dict[str, Callable[[], ResidualEchoGate]] = {
    "gate": ResidualEchoGate,
    "learns_user": lambda: ResidualEchoGate(user_above_db=math.inf),
}


def microphone(reply: PCM, users: list[tuple[PCM, int]], seed: int) -> PCM:
    """What the client's microphone hears (48 kHz): the reply's echo and the user's words."""
    mic = echo_of(reply, DELAY_MS, True, noise_seed=seed).astype(np.int32)
    for user, at in users:
        mic[at : at + len(user)] += user[: len(mic) - at]
    heard: PCM = np.clip(mic, -32768, 32767).astype(np.int16)
    return heard


def speech_starts(gate: ResidualEchoGate, reply: PCM, mic: PCM) -> tuple[list[float], list[float]]:
    """The detector's speech starts (ms) on the echo path's voice view, and the gain the gate
    had learnt at each 20 ms frame (dB; -10 until it is trusted)."""
    gains: list[float] = []
    _, voice = through(
        EchoPath(WebRtcEchoCanceller(), gate),
        reply,
        mic,
        each=lambda: gains.append(gate.gain_db if gate.gain_db is not None else -10.0),
    )
    starts = [ms for kind, ms in voice_events(detector(), voice) if kind is VadEventKind.START]
    return starts, gains


def run(seeds: int, arms: list[str]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for seed in range(seeds):
        voice = OnnxVoiceTts(threads=1, seed=20261203 + seed)
        reply = voice.synthesize(REPLY).pcm
        users = [
            (at_mic_level(voice.synthesize(text).pcm), int(len(reply) * at))
            for text, at in TALK_OVERS
        ]
        mic = microphone(reply, users, seed)
        row: dict[str, Any] = {"seed": 20261203 + seed}
        spans = [(at / 48, (at + len(user)) / 48) for user, at in users]  # ms
        for arm in arms:
            starts, gains = speech_starts(ARMS[arm](), reply, mic)
            first = [next((s - a for s in starts if a <= s < b), None) for a, b in spans]
            elsewhere = [s for s in starts if not any(a <= s < b + 300 for a, b in spans)]
            row[arm] = {"starts_after_ms": first, "starts_elsewhere_ms": elsewhere}
            row[arm]["gain_db_max"] = round(max(gains), 1)
            row[arm]["gain_above_minus_5_db_s"] = sum(1 for g in gains if g > -5) * 0.02
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {}
    for arm in arms:
        per = [row[arm] for row in rows]
        gains = sorted(r["gain_db_max"] for r in per)
        inflated = sorted(r["gain_above_minus_5_db_s"] for r in per)
        summary[arm] = {
            "talk_overs": [
                {
                    "words": text,
                    "start_within_500_ms": sum(
                        1 for r in per if (s := r["starts_after_ms"][i]) is not None and s <= 500
                    ),
                    "start_at_all": sum(1 for r in per if r["starts_after_ms"][i] is not None),
                }
                for i, (text, _) in enumerate(TALK_OVERS)
            ],
            "starts_elsewhere": sum(len(r["starts_elsewhere_ms"]) for r in per),
            "gain_db_max": {"min": gains[0], "p50": gains[len(gains) // 2], "max": gains[-1]},
            "seeds_gain_above_minus_5_db": sum(1 for g in gains if g > -5),
            "seconds_gain_above_minus_5_db_p50": round(inflated[len(inflated) // 2], 2),
        }
    return {"seeds": seeds, "summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=30, help="syntheses (default 30)")
    parser.add_argument("--ablate", choices=["user-frames"], help="also the gate before it")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/talk_over.json"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    arms = ["gate", "learns_user"] if args.ablate else ["gate"]
    result = run(args.seeds, arms)
    result["seconds"] = round(time.monotonic() - started, 1)
    write_summarised(result, args.out)  # with the machine (CPU model, ISA flags), the commit
    return 0


if __name__ == "__main__":
    sys.exit(main())
