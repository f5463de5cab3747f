"""The LLM engines on their own, as a reply uses them: llama.cpp against vLLM on one model.

For each question, in a cache scope of its own (one session each, the server's persona as the
system prompt):

- warm first token: the open turn is prefilled while the user "speaks" (the question less its
  last word, :meth:`prefill_open`), then the reply is streamed: its time to the first token is
  the LLM's share of voice-to-voice after the final transcript;
- cold first token: the first reply of a new scope with nothing prefilled, one per question;
  on llama.cpp both from nothing and, as the server runs it, from the persona shared at start
  (:meth:`share_prefix`, restored into a new scope's slot);
- decode: tokens per second of one reply alone, and of two replies generating at once;
- abort: a long reply closed after a few tokens (a barge-in): how long ``aclose()`` takes, and
  the next reply's first token in the same scope (its slot must be free at once).

Run: ``.venv/bin/python -m benchmarks.llm_bench [--engine llamacpp|vllm] [--model NAME]``; the
slow profile: ``scripts/slow.sh .venv/bin/python -m benchmarks.llm_bench ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import stamped
from benchmarks.voice_bench import QUESTIONS
from models.llm import GenerationStats, LlmEngine, Message
from server.config import RuntimeConfig
from server.machine import this_machine
from server.pipeline.cpuplan import this_process_plan

PERSONA = RuntimeConfig().persona
LONG_STORY = "Tell me a long story about a lighthouse keeper and his cat."


def chat(question: str) -> list[Message]:
    return [{"role": "system", "content": PERSONA}, {"role": "user", "content": question}]


def stats(engine: LlmEngine, request_id: str) -> GenerationStats:
    found = engine.last_stats(request_id)
    assert found is not None, request_id
    return found


async def reply(
    engine: LlmEngine, messages: list[Message], rid: str, max_tokens: int, salt: str
) -> dict[str, Any]:
    """Stream one reply; its first token (ms), decode rate (tokens/s) and text."""
    started = time.perf_counter()
    first: float | None = None
    text = []
    async for delta in engine.stream(messages, rid, max_tokens, cache_salt=salt):
        if first is None:
            first = time.perf_counter()
        text.append(delta)
    ended = time.perf_counter()
    got = stats(engine, rid)
    rate = None
    if first is not None and got.output_tokens > 1 and ended > first:
        rate = (got.output_tokens - 1) / (ended - first)
    return {
        "ttft_ms": None if first is None else (first - started) * 1000,
        "tokens_per_s": rate,
        "output_tokens": got.output_tokens,
        "prompt_tokens": got.prompt_tokens,
        "cached_tokens": got.cached_tokens,
        "text": "".join(text),
    }


def median(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return round(statistics.median(real), 1) if real else None


async def first_replies(
    engine: LlmEngine, questions: list[str], max_tokens: int, tag: str
) -> list[dict[str, Any]]:
    """Each question as the first reply of a new scope (its slot holds another's tokens)."""
    return [
        await reply(engine, chat(q), f"{tag}-{i}", max_tokens, f"scope-{tag}-{i}")
        for i, q in enumerate(questions)
    ]


async def measure(engine: LlmEngine, questions: list[str], max_tokens: int) -> dict[str, Any]:
    assert len(questions) >= 3, "the pair of replies needs three questions"
    unshared = await first_replies(engine, questions, max_tokens, "cold")
    cold, shared, share_ms = unshared, 0, None
    sharer = getattr(engine, "share_prefix", None)
    if sharer is not None:  # as the server does at start (llama.cpp)
        started = time.perf_counter()
        shared = await sharer([{"role": "system", "content": PERSONA}])
        share_ms = round((time.perf_counter() - started) * 1000, 1)
        cold = await first_replies(engine, questions, max_tokens, "cold-shared")
    warm: list[dict[str, Any]] = []
    for i, question in enumerate(questions):
        salt = f"scope-{i}"
        partial = question.rsplit(" ", 1)[0]
        opener = getattr(engine, "prefill_open", None)
        if opener is not None:
            await opener(chat(partial), f"w{i}-open", cache_salt=salt)
        else:
            await engine.prefill(chat(partial), f"w{i}-open", cache_salt=salt)
        warm.append(await reply(engine, chat(question), f"w{i}", max_tokens, salt))
    pair = await asyncio.gather(
        reply(engine, chat(questions[1]), "pair-a", max_tokens, "scope-0"),
        reply(engine, chat(questions[2]), "pair-b", max_tokens, "scope-1"),
    )
    aborts = [await abort_once(engine, i) for i in range(3)]
    return {
        "cold_ttft_ms": unshared[0]["ttft_ms"],
        "cold_ttft_ms_p50": median([c["ttft_ms"] for c in cold]),
        "cold_cached_tokens_p50": median([c["cached_tokens"] for c in cold]),
        "cold_from_nothing_ttft_ms_p50": median([c["ttft_ms"] for c in unshared]),
        "shared_prefix_tokens": shared,
        "share_prefix_ms": share_ms,
        "warm_ttft_ms_p50": median([w["ttft_ms"] for w in warm]),
        "warm_ttft_ms": [round(w["ttft_ms"], 1) for w in warm if w["ttft_ms"] is not None],
        "warm_uncached_tokens_p50": median([w["prompt_tokens"] - w["cached_tokens"] for w in warm]),
        "decode_tokens_per_s_p50": median([w["tokens_per_s"] for w in warm]),
        "two_at_once_tokens_per_s": [
            None if p["tokens_per_s"] is None else round(p["tokens_per_s"], 1) for p in pair
        ],
        "abort_close_ms": [a["close_ms"] for a in aborts],
        "after_abort_ttft_ms": [a["next_ttft_ms"] for a in aborts],
        "answers": {q: w["text"] for q, w in zip(questions, warm, strict=True)},
    }


async def abort_once(engine: LlmEngine, i: int) -> dict[str, float | None]:
    salt = f"scope-abort-{i}"
    stream = engine.stream(chat(LONG_STORY), f"abort-{i}", 400, cache_salt=salt)
    for _ in range(5):
        await anext(stream)
    closing = time.perf_counter()
    await stream.aclose()  # type: ignore[attr-defined]
    close_ms = (time.perf_counter() - closing) * 1000
    after = await reply(engine, chat("Thanks."), f"after-{i}", 4, salt)
    return {"close_ms": round(close_ms, 1), "next_ttft_ms": after["ttft_ms"]}


async def start(engine_name: str, model: str) -> LlmEngine:
    plan = this_process_plan()
    if engine_name == "llamacpp":
        from models.llamacpp import LlamaCppEngine, LlamaCppOptions
        from models.prepare import default_gguf, embedded_gguf

        path = embedded_gguf(model) if model else default_gguf()
        options = LlamaCppOptions(
            slots=4, threads=plan.llm_threads, batch_threads=plan.llm_prompt_threads
        )
        return await LlamaCppEngine.start(path, options)
    from models.llm_vllm import VllmEngine, VllmOptions
    from models.prepare import prepare_llm

    return await VllmEngine.start(prepare_llm(), VllmOptions(omp_bind=plan.llm_bind))


async def run(engine_name: str, model: str, questions: list[str], max_tokens: int) -> Any:
    started = time.perf_counter()
    engine = await start(engine_name, model)
    load_s = time.perf_counter() - started
    try:
        results = await measure(engine, questions, max_tokens)
    finally:
        await engine.close()
    return {
        "engine": engine_name,
        "model": model or "default",
        "load_s": round(load_s, 1),
        **results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    parser.add_argument("--model", default="", help="an embedded GGUF's name (llama.cpp)")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS))
    parser.add_argument("--quick", action="store_true", help="3 questions, short replies")
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.questions, args.max_tokens = 3, 16
    print(f"machine: {this_machine().describe()}")
    print(f"CPU plan: {this_process_plan().describe()}")
    results = stamped(
        asyncio.run(run(args.engine, args.model, QUESTIONS[: args.questions], args.max_tokens))
    )
    shown = {k: v for k, v in results.items() if k not in {"answers", "machine"}}
    print(json.dumps(shown, indent=1))
    out = args.out or Path(f"benchmarks/results/llm_{args.engine}_{args.model or 'default'}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
