"""Word error rate of the recognisers on three sets, and the final transcript's time.

Sets:
- ``people``: recordings of people that Debian packages ship with their transcripts: the
  Asterisk PBX prompts (``asterisk-core-sounds-en-wav``, Allison Smith, 8 kHz telephone
  recordings, CC BY-SA 3.0; the texts in ``asterisk-core-sounds-en``'s ``core-sounds-en.txt``):
  every prompt of 1.5-9 s whose text has no digits or symbols spoken differently than written
  (``PEOPLE_LIMIT`` of them, in name order); pocketsphinx's test data
  (``pocketsphinx-testdata``: five LibriVox readings of *Sense and Sensibility* and five card
  names, each with its transcription); alsa-utils' channel names ("Front Left", 8 clips);
- ``espeak``: the 24 sentences of ``asr_bench`` and the 48 questions of ``answers_bench`` by
  espeak-ng (165 words a minute);
- ``joe``: the same texts in the avatar's own voice.

Recognisers: ``moonshine`` and ``whisper`` alone (Whisper tiny.en, the audio's window), and
``server``: what the server now runs (``server.pipeline.wiring.recogniser``: Moonshine with
Whisper, the cross-check on, in pieces of at most 8 s). For the server's recogniser, each clip
is also streamed as the partial loop streams it (``asr_bench.streaming``: partials every
300 ms, the final transcript after the stable words), and the final's time is reported: the
time from the end of the speech to the final text, the recogniser's part of the turn's end.

Run: ``.venv/bin/python -m benchmarks.words_bench`` (``scripts/slow.sh`` in front: a profile).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import pct, source_commit
from benchmarks.asr_bench import SENTENCES, streaming, words
from server.machine import this_machine
from tests.support.text import edit_distance

RATE_HZ = 16_000
ASTERISK = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
ASTERISK_TEXTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
PEOPLE_LIMIT = 60
SPHINX = Path("/usr/share/pocketsphinx/test/data")
ALSA = Path("/usr/share/sounds/alsa")
QUESTIONS = Path(__file__).parent / "data" / "questions.json"
Clip = tuple[str, str, npt.NDArray[np.int16]]  # (set, text, 16 kHz audio)
FILLERS = {"um", "uh", "er", "ah", "hmm", "mm"}


def plain(text: str) -> list[str]:
    """The words WER compares: ``asr_bench.words`` without fillers."""
    return [w for w in words(text) if w not in FILLERS]


def asterisk_texts() -> dict[str, str]:
    """Each prompt's file name (without .wav, folders as in the package) and its text."""
    texts: dict[str, str] = {}
    with gzip.open(ASTERISK_TEXTS, "rt", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            name, sep, text = line.partition(":")
            if sep and name.strip() and not name.startswith(";"):
                texts[name.strip()] = text.strip()
    return texts


def spoken_as_written(text: str) -> bool:
    """Text a recogniser may write as it is said: letters and plain punctuation only (no
    digits, no bracketed notes, no symbols read out)."""
    return bool(text) and re.fullmatch(r"[A-Za-z ,.?!'-]+", text) is not None


def sphinx_texts() -> dict[Path, str]:
    """pocketsphinx's test recordings and their transcriptions (``<s> text </s> (name)``)."""
    texts: dict[Path, str] = {}
    for folder, listing in (("librivox", "transcription"), ("cards", "cards.transcription")):
        for line in (SPHINX / folder / listing).read_text().splitlines():
            found = re.fullmatch(r"<s>(.*)</s>\s*\((\S+)\)", line.strip())
            if found:
                texts[SPHINX / folder / f"{found.group(2)}.wav"] = found.group(1).strip()
    return texts


def people(limit: int = PEOPLE_LIMIT) -> list[Clip]:
    """The ``people`` set (see the module): ``limit`` Asterisk prompts and the others;
    RuntimeError if the packages are missing."""
    from client.cli import load_wav
    from server.pipeline.resample import resample

    if not ASTERISK_TEXTS.is_file() or not SPHINX.is_dir() or not ALSA.is_dir():
        raise RuntimeError(
            "install asterisk-core-sounds-en(-wav), pocketsphinx-testdata and alsa-utils "
            "(scripts/setup.sh)"
        )
    chosen: list[tuple[Path, str]] = []
    for name, text in sorted(asterisk_texts().items()):
        path = ASTERISK / f"{name}.wav"
        if len(chosen) < limit and spoken_as_written(text) and path.is_file():
            chosen.append((path, text))
    chosen += sorted(sphinx_texts().items())[: max(2, limit // 6)]
    alsa = sorted(ALSA.glob("[FRS]*_*.wav"))[: max(2, limit // 7)]
    chosen += [(path, path.stem.replace("_", " ")) for path in alsa]
    clips: list[Clip] = []
    for path, text in chosen:
        pcm = load_wav(path)  # 48 kHz
        if 1.0 <= len(pcm) / 48_000 <= 9.0:
            clips.append(("people", text, resample(pcm, 48_000, RATE_HZ)))
    return clips


def synthetic(texts: list[str]) -> list[Clip]:
    """The ``espeak`` and ``joe`` sets."""
    from benchmarks.asr_bench import voices

    return [("joe" if voice == "piper" else "espeak", t, pcm) for voice, t, pcm in voices(texts)]


def recogniser(name: str, threads: int) -> Any:
    from models.asr import WhisperAsr
    from models.moonshine import MoonshineAsr
    from server.pipeline.wiring import recogniser as servers

    if name == "moonshine":
        return MoonshineAsr(cpu_threads=threads)
    if name == "whisper":
        return WhisperAsr(cpu_threads=threads)
    return servers("moonshine-tiny", threads, "audio", cross_check=True)


def wer(clips: list[Clip], heard: list[str]) -> tuple[float, list[str]]:
    errors = total = 0
    misses = []
    for (_, text, _), got in zip(clips, heard, strict=True):
        wrong = edit_distance(plain(text), plain(got))
        errors, total = errors + wrong, total + len(plain(text))
        if wrong:
            misses.append(f"{text!r} -> {got!r}")
    return round(errors / max(1, total), 4), misses


def run(threads: int, quick: bool) -> dict[str, Any]:
    questions = [q["q"] for q in json.loads(QUESTIONS.read_text())["questions"]]
    texts = SENTENCES[:4] if quick else SENTENCES + questions
    clips = people(8 if quick else PEOPLE_LIMIT) + synthetic(texts)
    sets = sorted({s for s, _, _ in clips})
    results: dict[str, Any] = {"machine": this_machine().to_dict(), "threads": threads}
    for name in ("moonshine", "whisper", "server"):
        asr = recogniser(name, threads)
        asr.transcribe(clips[0][2])
        results[name] = {}
        for kind in sets:
            mine = [c for c in clips if c[0] == kind]
            started = time.perf_counter()
            heard = [asr.transcribe(pcm) for _, _, pcm in mine]
            took = (time.perf_counter() - started) * 1000 / len(mine)
            rate, misses = wer(mine, heard)
            results[name][kind] = {"wer": rate, "call_ms_mean": round(took), "misheard": misses}
        if name != "server":
            continue
        for kind in sets:
            mine = [c for c in clips if c[0] == kind]
            runs = [streaming(asr, pcm) for _, _, pcm in mine]
            finals = [final_ms for _, final_ms, _, _ in runs]
            rate, _ = wer(mine, [text for text, _, _, _ in runs])
            results[name][kind]["streamed_wer"] = rate
            results[name][kind]["final_ms_p50"] = round(statistics.median(finals))
            results[name][kind]["final_ms_p90"] = round(pct(finals, 0.9))
    results["clips"] = {kind: sum(1 for c in clips if c[0] == kind) for kind in sets}
    results["speech_s_mean"] = {
        kind: round(statistics.mean(len(p) / RATE_HZ for s, _, p in clips if s == kind), 2)
        for kind in sets
    }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a few clips of each set (smoke)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/words.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    results = run(args.threads, args.quick)
    results["commit"] = source_commit()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"clips: {results['clips']}, seconds each: {results['speech_s_mean']}")
    for name in ("moonshine", "whisper", "server"):
        for kind, figures in results[name].items():
            shown = {k: v for k, v in figures.items() if k != "misheard"}
            print(f"{name:>9} {kind:>7}: {shown}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
