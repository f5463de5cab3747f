"""The speech recognisers: word error rate and what a call costs, by recogniser and window.

The test set is 24 questions and requests of the kind people ask the avatar, each spoken by two
synthetic voices: Piper's joe (the avatar's own voice) and espeak-ng. Five ways to recognise:

- ``full``: Whisper tiny.en encoding a 30 s window per call, as faster-whisper does (the
  server's recogniser before; ``pipeline.asr_window = "full"``);
- ``audio``: the same weights encoding only the utterance plus 1 s of silence;
- ``streaming``: ``audio`` as the server runs it while the user speaks: a partial transcript
  every 300 ms of audio, the words two partials agree on become the decoder's prefix, and the
  final transcript continues after them;
- ``moonshine`` and ``moonshine_streaming``: Moonshine tiny (``pipeline.asr_model =
  "moonshine-tiny"``; its encoder reads the raw audio as long as it is), called the same ways
  on the same clips.

Reports each mode's WER on the whole set, the median call time by utterance length, and for
streaming the final decode's time and the partials' CPU time per second of speech.

Run: ``.venv/bin/python -m benchmarks.asr_bench`` (``scripts/slow.sh`` in front: slow profile).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import at_mic_level, pct, source_commit
from server.machine import this_machine
from tests.support.text import edit_distance

SENTENCES = [
    "What is the capital of France?",
    "Tell me a short story about a cat.",
    "How far away is the moon from the earth?",
    "Can you recommend a good book for a long train ride?",
    "What should I cook for dinner tonight?",
    "Why is the sky blue during the day?",
    "Please remind me to call my sister tomorrow morning.",
    "How do I make a cup of green tea?",
    "What is the weather usually like in London in the spring?",
    "Who wrote the play Romeo and Juliet?",
    "Could you explain how a rainbow forms?",
    "I would like to book a table for two people.",
    "What time does the museum open on Sunday?",
    "How many legs does a spider have?",
    "Tell me a joke about computers.",
    "What is the difference between a frog and a toad?",
    "Which language is spoken in Brazil?",
    "Can you help me plan a trip to the mountains?",
    "What is your favorite color and why?",
    "How do plants turn sunlight into food?",
    "Please speak a little more slowly.",
    "What are the planets of the solar system?",
    "Thank you, that was very helpful.",
    "Hello there, how are you today?",
]
PARTIAL_STEP_S = 0.3
RATE_HZ = 16_000


def words(text: str) -> list[str]:
    """Lower-case words without punctuation (what WER compares)."""
    kept = "".join(ch.lower() if ch.isalnum() or ch == "'" else " " for ch in text)
    return kept.split()


def score(
    clips: list[tuple[str, str, npt.NDArray[np.int16]]], heard: list[str]
) -> tuple[float, list[str]]:
    """Word error rate of ``heard`` (one text per clip) over the whole set, and the misheard
    clips as ``voice: 'said' -> 'heard'``."""
    errors, total, misses = 0, 0, []
    for (voice, text, _), got in zip(clips, heard, strict=True):
        wrong = edit_distance(words(text), words(got))
        errors += wrong
        total += len(words(text))
        if wrong:
            misses.append(f"{voice}: {text!r} -> {got!r}")
    return round(errors / total, 4), misses


def voices(sentences: list[str]) -> list[tuple[str, str, npt.NDArray[np.int16]]]:
    """(voice, sentence, 16 kHz audio) for Piper's joe and espeak-ng."""
    from models.tts import OnnxVoiceTts
    from server.pipeline.resample import resample

    piper = OnnxVoiceTts()
    out = []
    for text in sentences:
        said = at_mic_level(piper.synthesize(text).pcm)
        out.append(("piper", text, resample(said, 48_000, RATE_HZ)))
    for text in sentences:
        wav = subprocess.run(
            ["espeak-ng", "--stdout", "-s", "165", text], capture_output=True, check=True
        ).stdout
        pcm = np.frombuffer(wav[44:], np.int16)  # espeak-ng writes 22,050 Hz mono WAV
        out.append(("espeak", text, resample(pcm, 22_050, RATE_HZ)))
    return out


def streaming(asr: Any, pcm: npt.NDArray[np.int16]) -> tuple[str, float, float, int]:
    """(final text, final decode ms, partials' ms, decodes done again without the stable
    words) as the server's partial loop runs (server/conversation/partials.py)."""
    from server.conversation.partial_words import ended_early, heard_more, stable_words

    again = 0

    def decode(audio: npt.NDArray[np.int16], stable: str, before: str) -> str:
        nonlocal again
        text: str = asr.transcribe(audio, prefix=stable)
        if not ended_early(stable, text, before):
            return text
        again += 1
        whole: str = asr.transcribe(audio)
        return whole if heard_more(whole, text) else text

    step = int(PARTIAL_STEP_S * RATE_HZ)
    previous = stable = ""
    partial_ms = 0.0
    for end in range(int(1.5 * RATE_HZ), len(pcm), step):
        started = time.perf_counter()
        text = decode(pcm[:end], stable, previous)
        partial_ms += (time.perf_counter() - started) * 1000
        agreed = stable_words(previous, text)
        stable = agreed if len(agreed) > len(stable) else stable
        previous = text
    started = time.perf_counter()
    final = decode(pcm, stable, previous)
    return final, (time.perf_counter() - started) * 1000, partial_ms, again


MODES = ("full", "audio", "moonshine")
STREAMED = {"audio": "streaming", "moonshine": "moonshine_streaming"}


def recogniser(mode: str, threads: int) -> Any:
    from models.asr import WhisperAsr
    from models.moonshine import MoonshineAsr

    if mode == "moonshine":
        return MoonshineAsr(cpu_threads=threads)
    return WhisperAsr(cpu_threads=threads, window=mode)


def run(threads: int, sentences: list[str]) -> dict[str, Any]:
    clips = voices(sentences)
    results: dict[str, Any] = {"machine": this_machine().to_dict(), "threads": threads}
    speech_s = sum(len(pcm) for _, _, pcm in clips) / RATE_HZ
    for mode in MODES:
        asr = recogniser(mode, threads)
        asr.transcribe(clips[0][2])
        heard, times = [], []
        for _, _, pcm in clips:
            started = time.perf_counter()
            heard.append(asr.transcribe(pcm))
            times.append((time.perf_counter() - started) * 1000)
        wer, misses = score(clips, heard)
        results[mode] = {
            "wer": wer,
            "call_ms_p50": round(statistics.median(times)),
            "call_ms_max": round(max(times)),
            "misheard": misses,
        }
        if mode in STREAMED:
            runs = [streaming(asr, pcm) for _, _, pcm in clips]
            finals = [final_ms for _, final_ms, _, _ in runs]
            wer, misses = score(clips, [text for text, _, _, _ in runs])
            results[STREAMED[mode]] = {
                "wer": wer,
                "final_ms_p50": round(statistics.median(finals)),
                "final_ms_p90": round(pct(finals, 0.9)),
                "partials_cpu_ms_per_speech_s": round(sum(s for _, _, s, _ in runs) / speech_s),
                "decoded_again": sum(n for _, _, _, n in runs),
                "misheard": misses,
            }
    results["clips"] = len(clips)
    results["speech_s_mean"] = round(speech_s / len(clips), 2)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="4 sentences (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/asr.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    results = run(args.threads, SENTENCES[:4] if args.quick else SENTENCES)
    results["commit"] = source_commit()
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['clips']} clips, {results['speech_s_mean']} s each on average")
    for mode in (*MODES, *STREAMED.values()):
        shown = {k: v for k, v in results[mode].items() if k != "misheard"}
        print(f"{mode:>19}: {shown}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
