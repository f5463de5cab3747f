"""What the words of an interjection say, offline: the recogniser and the backchannel rule alone.

``interjection_bench`` runs whole calls (40 trials, 8 minutes, one voice); this runs only the
part that decides most of its misses: the primed transcript of a short interjection and
``is_backchannel`` on it. Each phrase is spoken by espeak-ng in several voices and at three
speeds, sent through an Opus round trip (libopus, 32 kbps, 20 ms frames, as a WebRTC peer's
microphone) and resampled to 16 kHz, and cut as the floor cuts it (server/conversation/floor.py):

- the final clip: ``PREROLL_MS`` before the onset to ``vad.interjection_quiet_ms`` after the last
  loud sample (the judge's hearing once the speech falls quiet);
- where the voice lasts past ``vad.interruption_ms``, also the clip up to that point (the hearing
  while it goes on: any word that is not a backchannel interrupts at once).

A phrase stops the reply where either hearing is not a backchannel. Backchannels should resume,
interruptions should stop. Coughs and clicks are left out: the confirming voice model decides
those before any words are heard (``interjection_bench`` has them). Each prime (Whisper's
previous text, ``--context``; the server's ``INTERJECTION_CONTEXT`` and none by default) is
scored on the same clips.

Run: ``.venv/bin/python -m benchmarks.interjection_words`` (``--quick``: one voice, one speed).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from benchmarks import write_summarised
from benchmarks.interjection_bench import BACKCHANNELS, INTERRUPTIONS
from client.cli import load_wav
from server.config import VadConfig
from server.conversation.floor import PREROLL_MS
from server.conversation.interjection import INTERJECTION_CONTEXT, is_backchannel
from server.runtime.media import resample

PCM = npt.NDArray[np.int16]
RATE = 16_000
LOUD = 500  # a sample louder than this is voice (int16), as interjection_bench's onset
# beyond the call's sets: more backchannels, and short interruptions a prime may bend
MORE_BACKCHANNELS = ["Hmm.", "Got it.", "Alright.", "Mm.", "Yep.", "Uh huh, yeah."]
MORE_INTERRUPTIONS = ["Enough.", "No.", "Hey.", "Listen."]
VOICES = ["en-us", "en-gb", "en-us+f3", "en-gb-x-rp+m3", "en-029"]
SPEEDS = [140, 175, 210]  # words per minute (espeak-ng's default: 175)


@dataclass(frozen=True)
class Clips:
    """One spoken phrase as the judge hears it: the final clip, and the clip while it goes on
    (None where the voice ends before ``vad.interruption_ms``)."""

    final: PCM
    going_on: PCM | None


def espeak(text: str, voice: str, speed: int) -> PCM:
    """``text`` said by espeak-ng (48 kHz mono int16)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "said.wav"
        cmd = ["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text]
        subprocess.run(cmd, check=True, capture_output=True)
        return load_wav(path)


def opus_round_trip(pcm: PCM) -> PCM:
    """48 kHz mono int16 through libopus and back, resampled to 16 kHz."""
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate, encoder.layout, encoder.format = 48_000, "mono", "s16"
    encoder.bit_rate = 32_000
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate, decoder.layout = 48_000, "mono"
    frame = 960  # 20 ms
    padded = np.concatenate([pcm, np.zeros(-len(pcm) % frame, np.int16)])
    out: list[PCM] = []
    for start in range(0, len(padded), frame):
        chunk = av.AudioFrame.from_ndarray(
            padded[start : start + frame].reshape(1, -1), format="s16", layout="mono"
        )
        chunk.sample_rate, chunk.pts = 48_000, start
        for packet in encoder.encode(chunk):
            out.extend(f.to_ndarray().reshape(-1).astype(np.int16) for f in decoder.decode(packet))
    return resample(np.concatenate(out).astype(np.int16), 48_000, RATE)


def clips_of(pcm: PCM, vad: VadConfig) -> Clips:
    """16 kHz speech cut as the floor cuts an interjection (see the module's docstring)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LOUD)
    onset, last = int(loud[0]), int(loud[-1])
    preroll = int(PREROLL_MS * RATE / 1000)
    lead = np.zeros(max(0, preroll - onset), np.int16)  # silence where the audio began sooner
    tail = last + int(vad.interjection_quiet_ms * RATE / 1000)
    final = np.concatenate([lead, pcm[max(0, onset - preroll) : tail]])
    upto = preroll + int(vad.interruption_ms * RATE / 1000)
    return Clips(final, final[:upto] if last - onset > upto - preroll else None)


def stops(heard: list[str]) -> bool:
    """Whether the reply stops on these hearings (any of them not a backchannel)."""
    return any(not is_backchannel(text) for text in heard)


def score(trials: list[dict[str, Any]], context: str) -> dict[str, Any]:
    """Backchannels resumed and interruptions stopped with ``context``, and the misses."""
    false = [t for t in trials if not t["real"]]
    real = [t for t in trials if t["real"]]
    missed = [t for t in trials if stops(t["heard"][context]) != t["real"]]
    return {
        "backchannels_resumed": sum(not stops(t["heard"][context]) for t in false),
        "backchannels": len(false),
        "interruptions_stopped": sum(stops(t["heard"][context]) for t in real),
        "interruptions": len(real),
        "decode_ms_p50": round(statistics.median(t["ms"][context] for t in trials), 1),
        "missed": [
            f"{t['text']} ({t['voice']}, {t['speed']}): {t['heard'][context]}" for t in missed
        ],
    }


def run(quick: bool, contexts: list[str]) -> dict[str, Any]:
    from models.asr import WhisperAsr

    asr = WhisperAsr()
    vad = VadConfig()
    phrases = [(t, False) for t in BACKCHANNELS + MORE_BACKCHANNELS]
    phrases += [(t, True) for t in INTERRUPTIONS + MORE_INTERRUPTIONS]
    voices, speeds = (VOICES[:1], SPEEDS[1:2]) if quick else (VOICES, SPEEDS)
    trials: list[dict[str, Any]] = []
    for (text, real), voice, speed in itertools.product(phrases, voices, speeds):
        clips = clips_of(opus_round_trip(espeak(text, voice, speed)), vad)
        heard: dict[str, list[str]] = {}
        ms: dict[str, float] = {}
        for context in contexts:
            started = time.perf_counter()
            heard[context] = [
                asr.transcribe_after(clip, context)
                for clip in (clips.going_on, clips.final)
                if clip is not None
            ]
            ms[context] = (time.perf_counter() - started) * 1000
        trials.append(
            {"text": text, "real": real, "voice": voice, "speed": speed, "heard": heard, "ms": ms}
        )
    by_context = {context or "(none)": score(trials, context) for context in contexts}
    summary = {
        name: {k: v for k, v in figures.items() if k != "missed"}
        for name, figures in by_context.items()
    }
    return {"summary": summary, "contexts": by_context, "trials": trials}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the words of interjections, offline")
    parser.add_argument("--quick", action="store_true", help="one voice at one speed")
    parser.add_argument(
        "--context",
        action="append",
        default=None,
        help="a prime to compare (repeatable; default: the server's and none)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/interjection_words.json")
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    contexts = args.context or [INTERJECTION_CONTEXT, ""]
    write_summarised(run(args.quick, contexts), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
