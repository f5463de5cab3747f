"""Incremental prefill, ablated: what partial transcripts and the LLM's prefix-cache warm-ups
each do to a reply, on the embedded models through a real server and a real peer.

Three modes in one run, each its own server process, asked the same spoken questions (the
project's TTS, sent as the peer's microphone) in one conversation:

- ``baseline``: no partial transcripts, no warm-ups (``pipeline.incremental=false``);
- ``partials``: partial transcripts while the user speaks, no warm-ups (the voice pipeline with
  ``warm_prefix`` off, built by :func:`partials_only`);
- ``partials_prefill``: partial transcripts, and each time their stable words grow a warm-up
  of the prompt with the user turn left open (the server's default).

The questions are long (one sentence of 28-34 words, 7-8.5 s of speech each) and asked in one
conversation, so that each turn's prompt is the persona, the earlier turns as heard and ~40
tokens of question: past the blocks the previous reply left cached, the question spans at
least one whole 32-token KV block, the smallest vLLM's CPU backend takes. (The short questions
of ``voice_bench`` do not: a first turn is 27 tokens, under one block.)

Per mode, from each reply's ``response.timings``: the prompt tokens served from the prefix
cache (``cached_tokens``), the prompt tokens computed after the final transcript (prompt minus
cached), the LLM's first token after the final transcript (``llm_first_token_ms -
asr_final_ms``), the final transcript and voice-to-voice (after the end-of-turn decision);
medians.

Run: ``.venv/bin/python -m benchmarks.prefill_ablation`` (``--quick`` for a smoke run;
``--modes partials_prefill --questions 5`` for one mode on the first questions, e.g. to compare
two commits' transcripts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import pct, source_commit
from models.llm_vllm import VllmOptions
from server.machine import this_machine

if TYPE_CHECKING:
    from server.config import Config
    from server.pipeline.voice import VoicePipeline

QUESTIONS = [
    "I am planning a trip to the mountains next month with two friends and I would like to know"
    " what kind of warm clothes and food we should pack for a week of walking",
    "My grandmother has started to grow tomatoes and beans in her small garden behind the house"
    " and she wants to know how often she should water them during the summer",
    "Can you explain in simple words why the sky looks blue during the day but turns orange and"
    " red in the evening just before the sun goes down",
    "We are having twelve people over for dinner on Saturday evening and two of them do not eat"
    " meat so what would be a good main dish that everybody can enjoy",
    "I keep waking up very early in the morning and then I cannot fall asleep again so what"
    " small changes to my evening routine could help me sleep a little longer",
    "Tell me about the history of the old city by the river and which of its famous buildings"
    " a visitor with only one free afternoon should really try to see first",
    "My daughter is learning to play the piano and she gets bored of practising the same songs"
    " every day so how can I help her enjoy the lessons again",
    "What are some easy ways for a small office of ten people to use less paper and electricity"
    " without spending a lot of money on new equipment this year",
]
MODES = ("baseline", "partials", "partials_prefill")
SETTINGS = {
    "server.debug_endpoints": "true",
    "transport.max_sessions": "2",
    "transport.connect_timeout_s": "60",
}


async def partials_only(config: Config) -> VoicePipeline:
    """The server's voice pipeline with its LLM warm-ups off (mode ``partials``)."""
    from server.pipeline.wiring import voice_pipeline

    pipeline = await voice_pipeline(config)
    pipeline.warm_prefix = False
    return pipeline


def mode_settings(mode: str) -> dict[str, str]:
    """The server settings of one mode."""
    if mode == "baseline":
        return {**SETTINGS, "pipeline.incremental": "false"}
    if mode == "partials":
        factory = "benchmarks.prefill_ablation:partials_only"
        return {**SETTINGS, "pipeline.incremental": "true", "pipeline.factory": factory}
    return {**SETTINGS, "pipeline.incremental": "true"}


def _stat(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    return {"p50": round(statistics.median(values), 1), "p95": round(pct(values, 0.95), 1)}


def summarize(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of one mode's turns, and each turn's token counts."""

    def values(key: str) -> list[float]:
        return [float(t[key]) for t in turns if t.get(key) is not None]

    after_final = [
        t["llm_first_token_ms"] - t["asr_final_ms"]
        for t in turns
        if t.get("llm_first_token_ms") is not None and t.get("asr_final_ms") is not None
    ]
    computed = [t["prompt_tokens"] - t["cached_tokens"] for t in turns]
    return {
        "turns": len(turns),
        "cached_tokens_p50": statistics.median(values("cached_tokens")),
        "prompt_tokens_p50": statistics.median(values("prompt_tokens")),
        "computed_tokens_p50": statistics.median(computed),
        "prefill_cached_tokens_p50": statistics.median(values("prefill_cached_tokens")),
        "llm_first_token_after_final_ms": _stat(after_final),
        "asr_final_ms": _stat(values("asr_final_ms")),
        "voice_to_voice_ms": _stat(values("voice_to_voice_ms")),
        "per_turn": [
            {
                "cached_tokens": t["cached_tokens"],
                "prompt_tokens": t["prompt_tokens"],
                "prefill_cached_tokens": t["prefill_cached_tokens"],
                "llm_first_token_after_final_ms": None
                if t.get("llm_first_token_ms") is None or t.get("asr_final_ms") is None
                else round(t["llm_first_token_ms"] - t["asr_final_ms"], 1),
                "voice_to_voice_ms": t.get("voice_to_voice_ms"),
                "heard": t["heard"],
            }
            for t in turns
        ],
    }


async def run(count: int, modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    from benchmarks.voice_bench import conversation, synthesize_questions
    from server.rtc.settings import pin_host_addresses
    from tests.support.server_process import ServerProcess

    pin_host_addresses(["127.0.0.1"])
    texts = QUESTIONS[:count]
    questions = synthesize_questions(texts)
    results: dict[str, Any] = {
        "machine": this_machine().to_dict(),
        "questions": texts,
        "speech_s": [round(len(q) / 48_000, 1) for q in questions],
        "block_size": VllmOptions().block_size,
    }
    for mode in modes:
        server = ServerProcess(mode_settings(mode)).start(timeout=300)
        try:
            turns = await conversation(server.url, questions)
        finally:
            server.stop()
        results[mode] = summarize(turns)
        shown = {k: v for k, v in results[mode].items() if k != "per_turn"}
        print(mode, json.dumps(shown))
    return results


def table(results: dict[str, Any]) -> list[str]:
    """The per-mode medians as aligned text lines."""
    lines = [
        f"{'mode':<17} {'cached':>6} {'prompt':>6} {'computed':>8} {'LLM 1st after final':>19}"
        f" {'ASR final':>9} {'voice-to-voice':>14}"
    ]
    for mode in (m for m in MODES if m in results):
        m = results[mode]
        lines.append(
            f"{mode:<17} {m['cached_tokens_p50']:>6} {m['prompt_tokens_p50']:>6}"
            f" {m['computed_tokens_p50']:>8} {m['llm_first_token_after_final_ms']['p50']!s:>16} ms"
            f" {m['asr_final_ms']['p50']!s:>6} ms {m['voice_to_voice_ms']['p50']!s:>11} ms"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    from benchmarks.netns import isolate

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 questions (a smoke run)")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS), help="the first N")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/prefill_ablation.json")
    )
    args = parser.parse_args(argv)
    isolate("benchmarks.prefill_ablation", argv)
    print(f"machine: {this_machine().describe()}")
    started = time.monotonic()
    results = asyncio.run(run(2 if args.quick else args.questions, tuple(args.modes)))
    results["wall_s"] = round(time.monotonic() - started, 1)
    results["commit"] = source_commit()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(table(results)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
