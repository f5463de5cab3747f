"""The inbound audio path's CPU, offline: what each 20 ms heard costs the event loop.

``Conversation.hear`` runs on the event loop for every 20 ms frame a client sends: the frame
resampled to 16 kHz, the avatar's echo taken out (server/pipeline/echo.py: WebRTC's AEC3 and
the residual echo gate) and the turn detector fed (webrtcvad, Silero while the gate is open).
Here a call's audio goes through the same steps, timed in this thread's CPU time: the avatar
replies (the joe voice, its echo back 100 ms later at -10 dB through a room, with the
microphone's hiss), then the user speaks with the avatar silent, three times over.

Reported per arm, the CPU (us) per 20 ms heard, median of ``--repeats``, while the avatar
talks and while it is silent (the user's turn), and the echo taken from the first second of
each reply after the first (dB, the canceller waking after a rest). Arms, on the same audio:

- **rests** (default): the canceller rests while nothing the avatar sent can come back
  (``EchoPath.rests``);
- **always** (``--ablate rest``): it hears every frame (before 2026-12-05).

Run: ``.venv/bin/python -m benchmarks.inbound_bench [--repeats 5]``; no server, no network.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from benchmarks import at_mic_level, write_summarised
from models.echo import WebRtcEchoCanceller
from models.tts import OnnxVoiceTts
from server.pipeline.echo import EchoPath
from server.pipeline.resample import resample
from tests.support.echo import HEARD, PULL, detector, echo_of

PCM = npt.NDArray[np.int16]
SEED = 20261205
REPLIES = (
    "The capital of France is Paris, a city on the river Seine with many museums.",
    "A spider has eight legs, and most spiders have eight eyes as well.",
    "Water boils at one hundred degrees at sea level, and less high up a mountain.",
)
QUESTIONS = (
    "And what is the capital of Italy?",
    "How many legs does an ant have?",
    "Why does water boil sooner on a mountain?",
)


def conversation(voice: OnnxVoiceTts) -> tuple[PCM, PCM, list[tuple[int, int, bool]]]:
    """What the server sends (48 kHz) and what the microphone hears (48 kHz), and the phases
    as (first, last) 20 ms frame and whether the avatar talks in it."""
    far: list[PCM] = []
    user: list[PCM] = []
    phases = []
    at = 0
    for reply, question in zip(REPLIES, QUESTIONS, strict=True):
        said = voice.synthesize(reply).pcm
        asked = at_mic_level(voice.synthesize(question).pcm)
        pause = np.zeros(48_000, np.int16)  # a second between the reply's end and the question
        far += [said, pause, np.zeros(len(asked), np.int16), pause]
        user += [np.zeros(len(said) + len(pause), np.int16), asked, pause]
        talking = len(said) // PULL
        phases.append((at, at + talking, True))
        at += talking
        silent = (len(pause) * 2 + len(asked)) // PULL
        phases.append((at, at + silent, False))
        at += silent
    sent = np.concatenate(far)
    mic = echo_of(sent, 100, True).astype(np.int32) + np.concatenate(user)
    return sent, np.clip(mic, -32768, 32767).astype(np.int16), phases


def one_pass(sent: PCM, mic: PCM, rests: bool) -> tuple[list[float], list[PCM], int]:
    """The call's audio through the inbound path, as ``Conversation.hear`` does: the CPU
    (us) of each 20 ms heard, the recogniser's view of it, and the frames rested."""
    path = EchoPath(WebRtcEchoCanceller())
    path.rests = rests
    turn = detector()
    resampler = av.AudioResampler(format="s16", layout="mono", rate=16_000)
    stereo = np.repeat(mic, 2).reshape(1, -1)  # a client's Opus decodes to stereo
    cpu, words = [], []
    for n in range(len(sent) // PULL):
        path.played(sent[n * PULL : (n + 1) * PULL])
        frame = av.AudioFrame.from_ndarray(
            stereo[:, 2 * n * PULL : 2 * (n + 1) * PULL], format="s16", layout="stereo"
        )
        frame.sample_rate = 48_000
        started = time.thread_time()
        heard = []
        for out in resampler.resample(frame):
            cleaned = path.clean(out.to_ndarray().reshape(-1).astype(np.int16))
            turn.push(cleaned.voice, n * 20.0, cleaned.heard)
            heard.append(cleaned.words)
        cpu.append((time.thread_time() - started) * 1e6)
        words.append(np.concatenate(heard) if heard else np.zeros(0, np.int16))
    return cpu, words, path.rested_frames


def db(pcm: PCM) -> float:
    return float(10 * np.log10(np.mean(np.square(pcm.astype(np.float64))) + 1e-9))


def run(repeats: int, arms: list[str]) -> dict[str, Any]:
    sent, mic, phases = conversation(OnnxVoiceTts(seed=SEED, cache_dir=None))
    heard16 = resample(mic, 48_000, 16_000)
    summary: dict[str, Any] = {}
    for arm in arms:
        talking: list[float] = []
        silent: list[float] = []
        for _ in range(repeats):
            cpu, words, rested = one_pass(sent, mic, arm == "rests")
            for first, last, avatar in phases:
                (talking if avatar else silent).append(statistics.median(cpu[first:last]))
        # the echo taken from the first second of each reply after the first (16 kHz, the
        # recogniser's view lags the microphone by less than a frame)
        out = np.concatenate(words)
        removed = []
        for first, _, avatar in phases[2:]:
            if avatar:
                span = slice(first * HEARD, (first + 50) * HEARD)
                removed.append(round(db(heard16[span]) - db(out[span]), 1))
        summary[arm] = {
            "cpu_us_per_20ms_avatar_talking": round(statistics.median(talking), 1),
            "cpu_us_per_20ms_avatar_silent": round(statistics.median(silent), 1),
            "frames_rested": rested,
            "echo_removed_db_first_second_after_a_pause": removed,
        }
    return {"repeats": repeats, "frames": len(sent) // PULL, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="passes per arm (default 5)")
    parser.add_argument("--ablate", choices=["rest"], help="also the canceller that never rests")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/inbound.json"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args.repeats, ["rests", "always"] if args.ablate else ["rests"])
    result["seconds"] = round(time.monotonic() - started, 1)
    write_summarised(result, args.out)  # with the machine (CPU model, ISA flags), the commit
    return 0


if __name__ == "__main__":
    sys.exit(main())
