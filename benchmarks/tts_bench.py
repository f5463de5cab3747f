"""Text to speech: the joe voice through piper-tts (espeak-ng, GPL) against the server's own
path (onnxruntime and gruut, models/tts.py), on the same everyday replies.

Each reply is cut into sentences as the server cuts a streamed reply (``flush_sentences``) and
each sentence is synthesized on its own. Reports per engine:

- ``rtf_p50``: real-time factor, synthesis time / audio duration, median over the sentences;
- ``first_chunk_ms_p50``: time to synthesize a reply's first sentence (what the listener waits
  for once the text is there), median over the replies;
- ``first_audio_ms_p50``: time to the first audio of a reply's first sentence: the same for an
  engine that gives a sentence whole; for ``pieces`` (the server's path for a chunk the
  playback waits for: ``OnnxVoiceTts.pieces``) the time to its first piece;
- ``wer``: each sentence's audio (16 kHz) through Whisper tiny.en, word error rate over all.

The voice is random (VITS noise), so the WER moves by a word or two between runs: each reply is
said ``--repeats`` times (3). piper-tts is imported here only, and only for the comparison:
without it that engine is skipped.

Run: ``.venv/bin/python -m benchmarks.tts_bench`` (``--quick``: 3 sentences, a smoke run).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import pct, source_commit
from server.machine import this_machine
from tests.support.text import edit_distance

REPLIES = [
    "Sure, I can help you with that.",
    "The weather looks sunny today, with a light breeze in the afternoon.",
    "Romeo and Juliet was written by William Shakespeare.",
    "Paris is the capital of France. It is famous for the Eiffel Tower.",
    "A spider has eight legs, and most spiders have eight eyes as well.",
    "You could try a mystery novel for your train ride. They are easy to read in short bursts.",
    "Heat the water until it is hot but not boiling. Then let the tea steep for two minutes.",
    "I'm sorry, I didn't quite catch that. Could you say it again?",
    "The museum opens at 10 in the morning on Sundays.",
    "Good morning! How did you sleep last night?",
    "Plants turn sunlight into food through photosynthesis.",
    "That sounds like a lovely plan! Don't forget to pack warm clothes for the mountains.",
    "A frog has smooth, wet skin, while a toad has dry and bumpy skin.",
    "People in Brazil speak Portuguese.",
    "Here is a joke. Why did the computer go to the doctor? It had a virus!",
    "Your table for two is booked for eight o'clock tonight.",
    "Rainbows form when sunlight is bent and reflected inside raindrops.",
    "It costs about 15 dollars, which is quite cheap.",
    "Thank you for asking! I'm doing well today.",
    "Let me think about that for a moment. The short answer is yes.",
]
QUICK = 3  # replies in a smoke run: one sentence each
RATE_HZ = 48_000
ASR_RATE_HZ = 16_000
ENGINES = ("piper", "onnx", "pieces")
# Whisper writes small numbers as digits or words: count both as the same word
_NUMBER_WORDS = (
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"),
    *("eighteen", "nineteen", "twenty"),
)
NUMBERS = {w: str(i) for i, w in enumerate(_NUMBER_WORDS)}


@dataclass(frozen=True)
class Voiced:
    """A sentence said: 48 kHz mono int16, and the time (s) to its first audio where that
    came before the whole (None: with the whole)."""

    pcm: npt.NDArray[np.int16]
    first_s: float | None = None


Say = Callable[[str], Voiced]  # text -> its audio


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, small numbers as digits, "$15" as "15 dollars"
    (what WER compares)."""
    text = re.sub(r"\$(\d[\d,.]*)", r"\1 dollars", text)
    kept = "".join(ch.lower() if ch.isalnum() or ch == "'" else " " for ch in text)
    return [NUMBERS.get(w, w) for w in kept.split()]


def score(said: Sequence[str], heard: Sequence[str]) -> tuple[float, list[str]]:
    """Word error rate of ``heard`` against ``said`` over the whole set, and the misheard
    texts as ``'said' -> 'heard'``."""
    errors = total = 0
    misses = []
    for text, got in zip(said, heard, strict=True):
        wrong = edit_distance(words(text), words(got))
        errors += wrong
        total += len(words(text))
        if wrong:
            misses.append(f"{text!r} -> {got!r}")
    return (round(errors / total, 4) if total else 0.0), misses


def onnx_engine(threads: int) -> Say:
    """The server's path: models.tts (onnxruntime, gruut)."""
    from models.tts import OnnxVoiceTts

    tts = OnnxVoiceTts(threads=threads)
    return lambda text: Voiced(tts.synthesize(text).pcm)


def pieces_engine(threads: int) -> Say:
    """The server's path in pieces (models.tts.OnnxVoiceTts.pieces), with the time to the
    first piece."""
    from models.tts import OnnxVoiceTts

    tts = OnnxVoiceTts(threads=threads)

    def say(text: str) -> Voiced:
        started = time.perf_counter()
        pcm: list[npt.NDArray[np.int16]] = []
        first_s = None
        for piece in tts.pieces(text, 0.0):
            if not pcm:
                first_s = time.perf_counter() - started
            pcm.append(piece.pcm)
        return Voiced(np.concatenate(pcm) if pcm else np.zeros(0, np.int16), first_s)

    return say


def piper_engine(threads: int) -> Say | None:
    """The former path: piper-tts's PiperVoice (espeak-ng phonemes) on the same ONNX session
    (alignment output, threads); None when piper-tts is not installed."""
    try:
        from piper import PiperConfig, PiperVoice, SynthesisConfig
    except ImportError:
        return None
    from models.tts import joe_voice_paths, open_voice_session, resample_to_48k

    model, config = joe_voice_paths()
    voice = PiperVoice(
        session=open_voice_session(model, threads),
        config=PiperConfig.from_dict(json.loads(config.read_text(encoding="utf-8"))),
    )
    syn_config = SynthesisConfig(volume=0.9)

    def say(text: str) -> Voiced:
        chunks = list(voice.synthesize(text, syn_config=syn_config, include_alignments=True))
        if not chunks:
            return Voiced(np.zeros(0, np.int16))
        audio = np.concatenate([chunk.audio_int16_array for chunk in chunks])
        return Voiced(resample_to_48k(audio, voice.config.sample_rate))

    return say


@dataclass
class Tally:
    """One engine's measurements so far."""

    load_ms: float
    rtf: list[float] = field(default_factory=list)  # synthesis time / audio time, a sentence
    first_ms: list[float] = field(default_factory=list)  # a reply's first sentence
    first_audio_ms: list[float] = field(default_factory=list)  # its first audio
    spoken: list[tuple[str, npt.NDArray[np.int16]]] = field(default_factory=list)  # 48 kHz

    def say(self, say: Say, reply: str) -> None:
        """Synthesize ``reply`` sentence by sentence, as the server does."""
        from models.tts import flush_sentences

        for i, sentence in enumerate(flush_sentences(reply)):
            started = time.perf_counter()
            voiced = say(sentence)
            took = time.perf_counter() - started
            self.rtf.append(took / max(len(voiced.pcm) / RATE_HZ, 1e-3))
            if i == 0:
                self.first_ms.append(took * 1000)
                first_s = took if voiced.first_s is None else voiced.first_s
                self.first_audio_ms.append(first_s * 1000)
            self.spoken.append((sentence, voiced.pcm))

    def figures(self, heard: Sequence[str]) -> dict[str, Any]:
        wer, misses = score([text for text, _ in self.spoken], heard)
        return {
            "rtf_p50": round(statistics.median(self.rtf), 3),
            "rtf_p90": round(pct(self.rtf, 0.9), 3),
            "first_chunk_ms_p50": round(statistics.median(self.first_ms)),
            "first_chunk_ms_p90": round(pct(self.first_ms, 0.9)),
            "first_audio_ms_p50": round(statistics.median(self.first_audio_ms)),
            "first_audio_ms_p90": round(pct(self.first_audio_ms, 0.9)),
            "wer": wer,
            "load_ms": round(self.load_ms),
            "sentences": len(self.rtf),
            "audio_s": round(sum(len(pcm) for _, pcm in self.spoken) / RATE_HZ, 1),
            "misheard": misses,
        }


def run(
    threads: int, replies: Sequence[str], engines: Sequence[str], repeats: int = 1
) -> dict[str, Any]:
    """Each engine says ``replies`` ``repeats`` times (the voice is random: more runs, a
    steadier WER), the engines taking turns reply by reply (a busy machine slows both)."""
    from models.asr import WhisperAsr
    from server.pipeline.resample import resample

    results: dict[str, Any] = {"machine": this_machine().to_dict(), "threads": threads}
    loaded: dict[str, tuple[Say, Tally]] = {}
    for name in engines:
        started = time.perf_counter()
        say = {"piper": piper_engine, "onnx": onnx_engine, "pieces": pieces_engine}[name](threads)
        if say is None:
            results[name] = {"skipped": "piper-tts is not installed (pip install -e '.[piper]')"}
            continue
        say("Hello.")  # first-call costs out of the figures
        loaded[name] = (say, Tally((time.perf_counter() - started) * 1000))
    for reply in list(replies) * repeats:
        for say, tally in loaded.values():
            tally.say(say, reply)
    asr = WhisperAsr(cpu_threads=threads)
    for name, (_, tally) in loaded.items():
        heard = [asr.transcribe(resample(pcm, RATE_HZ, ASR_RATE_HZ)) for _, pcm in tally.spoken]
        results[name] = tally.figures(heard)
    results["replies"] = len(replies)
    results["repeats"] = repeats
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} sentences (a smoke run)")
    parser.add_argument("--repeats", type=int, default=3, help="times each reply is said")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tts.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    replies = REPLIES[:QUICK] if args.quick else REPLIES
    results = run(args.threads, replies, args.engines, 1 if args.quick else args.repeats)
    results["commit"] = source_commit()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    for name in args.engines:
        shown = {k: v for k, v in results[name].items() if k != "misheard"}
        print(f"{name:>6}: {shown}")
        for miss in results[name].get("misheard", []):
            print(f"        misheard {miss}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
