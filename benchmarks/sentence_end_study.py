"""The words at a pause, judged three ways, offline: what chose ``vad.sentence_end_*``.

Each labelled utterance (the 40 + 40 of benchmarks/end_of_turn_bench.py, and the 30 + 30 and
20 + 20 of benchmarks/data/end_of_turn_sets.json) is spoken by the joe voice and read at its
pause, as the server reads it there: for a complete one where its speech ends, for an
unfinished one where its mid-sentence pause begins.

- **Smart Turn** hears the audio up to 60 and 200 ms into the quiet (``hearing.HEARINGS``).
- **Whisper** (the server's recogniser) decodes it with 200 ms of the quiet: the pause's words.
- **The LLM** (the embedded default on llama.cpp) gives those words' sentence-end probability
  (``LlamaCppEngine.sentence_end_probability``).

Then, per set, how many complete utterances each rule lets end at the pause (more is faster)
and how many unfinished ones it cuts off there (fewer is better):

- "model and marks": Smart Turn at its bars and no word that ends no sentence (the rule before
  the LLM's verdict: ``sounds_unfinished``);
- "llm": the rule before the recogniser's doubt (``unfinished.judge_words`` with ``Bars``);
- "llm and last word": the server's rule now, the same unless the recogniser gave a word that
  ends no sentence ``Bars.stranded`` or more in place of the last word (``Bars.doubts``);
- "llm alone": the LLM's verdict at ``Bars.alone`` without Smart Turn.

No timing: this is what each rule decides, not when (benchmarks/end_of_turn_bench.py times it
in conversations). Run: ``.venv/bin/python -m benchmarks.sentence_end_study`` (about 2 min).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

from benchmarks import stamped
from benchmarks.end_of_turn_bench import COMPLETE, RATE, UNFINISHED, Utterance, build_set
from server.config import load_config
from server.conversation.hearing import HEARINGS
from server.conversation.unfinished import Bars, Words, judge_words, sounds_unfinished, stranded
from server.pipeline.resample import resample

SETS = Path(__file__).parent / "data" / "end_of_turn_sets.json"
WORDS_QUIET_MS = 200  # of the pause the recogniser hears


def labelled_sets() -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    more = json.loads(SETS.read_text())["sets"]
    sets = {"first": (COMPLETE, UNFINISHED)}
    for name, s in more.items():
        sets[name] = (s["complete"], [(a, b) for a, b in s["unfinished"]])
    return sets


def read_at_pause(utterances: list[Utterance]) -> list[dict[str, Any]]:
    from models.asr import WhisperAsr
    from models.turn import SmartTurn

    model, asr = SmartTurn(threads=1), WhisperAsr(cpu_threads=2)
    rows = []
    for u in utterances:
        pcm = resample(u.audio, RATE, 16_000)
        at = int((u.speech_end_ms if u.pause_ms is None else u.pause_ms[0]) * 16)
        heard = {h.quiet_ms: model.probability(pcm[: at + int(h.quiet_ms * 16)]) for h in HEARINGS}
        words, rivals = asr.hear(pcm[: at + WORDS_QUIET_MS * 16])
        kind = "complete" if u.pause_ms is None else "unfinished"
        rows.append(
            {
                "text": u.text,
                "kind": kind,
                "smart_turn": heard,
                "words": words,
                "rivals": [[r, round(p, 4)] for r, p in rivals],
                "stranded": round(stranded(words, rivals), 3),
            }
        )
    return rows


async def judge(rows: list[dict[str, Any]]) -> None:
    from models.llamacpp import LlamaCppEngine, LlamaCppOptions
    from models.prepare import DEFAULT_GGUF, embedded_gguf

    persona = load_config().runtime.persona
    engine = await LlamaCppEngine.start(embedded_gguf(DEFAULT_GGUF), LlamaCppOptions(slots=1))
    try:
        for row in rows:
            chat = [
                {"role": "system", "content": persona},
                {"role": "user", "content": row["words"]},
            ]
            p = await engine.sentence_end_probability(chat, cache_salt="s") if row["words"] else 0.0
            row["sentence_end"] = round(p, 3)
    finally:
        await engine.close()


def decide(row: dict[str, Any], rule: str, bars: Bars, threshold: float) -> bool:
    """Whether ``rule`` ends the turn at this pause."""
    complete = any(h.sounds_complete(row["smart_turn"][h.quiet_ms], threshold) for h in HEARINGS)
    if rule == "model and marks":
        return complete and not sounds_unfinished(row["words"])
    if rule == "llm alone":
        return bool(row["sentence_end"] >= bars.alone)
    rivals = tuple((r, p) for r, p in row["rivals"]) if rule == "llm and last word" else ()
    return judge_words(row["words"], row["sentence_end"], complete, bars, rivals) is Words.END


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the words at a pause, judged offline")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sentence_end.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    vad = load_config().vad
    bars = Bars.of(vad)
    import benchmarks.end_of_turn_bench as bench

    results: dict[str, Any] = {
        "bars": {"alone": bars.alone, "with_model": bars.with_model, "stranded": bars.stranded}
    }
    for seed, (name, (complete, unfinished)) in enumerate(labelled_sets().items()):
        bench.COMPLETE, bench.UNFINISHED = complete, unfinished  # build_set speaks these
        try:
            rows = read_at_pause(build_set(False, random.Random(11 + seed)))
        finally:
            bench.COMPLETE, bench.UNFINISHED = COMPLETE, UNFINISHED
        asyncio.run(judge(rows))
        summary: dict[str, Any] = {}
        for rule in ("model and marks", "llm", "llm and last word", "llm alone"):
            ends = [decide(r, rule, bars, vad.complete_probability) for r in rows]
            summary[rule] = {
                "complete_ended_at_the_pause": sum(
                    e for e, r in zip(ends, rows, strict=True) if r["kind"] == "complete"
                ),
                "unfinished_cut_off": sum(
                    e for e, r in zip(ends, rows, strict=True) if r["kind"] == "unfinished"
                ),
            }
        results[name] = {"complete": len(complete), "unfinished": len(unfinished), **summary}
        results[name]["utterances"] = rows
        print(json.dumps({name: summary}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
