"""A long conversation on the LLM engine: what the recent window's slide costs each reply.

The model context is the persona, a recent window of turns (``runtime.recent_window_tokens``)
and the user's turn. Once a conversation is longer than the window, the window must slide.
Two conversations of the same questions take turns on one engine (llama.cpp, the embedded
default model, the CPU plan's threads, a slot and a cache scope each):

- ``steps``: the history as the server keeps it (``History.window_keep``, 0.5): the window's
  start stays put while the turns fit, then moves on to what fits half the budget, early
  (``History.make_room``) when a reply has played out and little room is left;
- ``turn_by_turn``: the start moves as soon as a turn no longer fits (``window_keep`` 1.0, no
  early move), so the prompt after the persona changes at every turn once the window is full.

Each exchange goes as in a call: the user's words are warmed at the pause (``prefill_open``,
the turn left open, as the partial loop does), then the turn is committed and the reply
streamed (``llm_max_tokens``); the reply's words join the history, and once it has played
out, the window moves on if nearly full and is then warmed, as the server does (``after``:
while the user listens; ``steps`` only). Reported per exchange: each warm-up's time and the
tokens it computed (prompt less cached), the reply's first token (ms from its request) and
the tokens it computed. A warm-up at the pause
that runs past it delays the reply by the rest (llama.cpp cannot stop a prompt halfway), so
"warm-up + first token" is the reply's wait when the pause is short.

Run: ``.venv/bin/python -m benchmarks.long_conversation_bench [--exchanges 48]``
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import stamped
from models.llm import LlmEngine
from server.config import RuntimeConfig, load_config
from server.machine import this_machine
from server.pipeline.cpuplan import this_process_plan
from server.pipeline.voice import to_messages
from server.runtime.history import History, Role

QUESTIONS = Path("benchmarks/data/questions.json")
# History.window_keep (None: as the server), and whether the window makes room once a reply
# has played out (History.make_room, as the server does)
POLICIES: dict[str, tuple[float | None, bool]] = {
    "steps": (None, True),
    "turn_by_turn": (1.0, False),
}


async def start_engine() -> LlmEngine:
    from models.llamacpp import LlamaCppEngine, LlamaCppOptions
    from models.prepare import default_gguf

    plan = this_process_plan()
    options = LlamaCppOptions(
        slots=len(POLICIES), threads=plan.llm_threads, batch_threads=plan.llm_prompt_threads
    )
    return await LlamaCppEngine.start(default_gguf(), options)


async def exchange(
    engine: LlmEngine,
    history: History,
    question: str,
    n: int,
    salt: str,
    budget: int,
    make_room: bool,
) -> dict[str, Any]:
    """One turn: the question warmed at the pause, committed, the reply streamed and kept."""
    from models.llamacpp import LlamaCppEngine

    assert isinstance(engine, LlamaCppEngine)
    history.set_user_text(question)
    started = time.perf_counter()
    warm = await engine.prefill_open(
        to_messages(history.context(budget)), f"{salt}-w{n}", cache_salt=salt, paused=True
    )
    warm_ms = (time.perf_counter() - started) * 1000
    history.end_user_turn(0, item_id=f"u{n}")
    context = history.context(budget)
    rid = f"{salt}-r{n}"
    started = time.perf_counter()
    first_ms: float | None = None
    words: list[str] = []
    async for delta in engine.stream(
        to_messages(context), rid, load_config().pipeline.llm_max_tokens, cache_salt=salt
    ):
        if first_ms is None:
            first_ms = (time.perf_counter() - started) * 1000
        words.append(delta)
    stats = engine.last_stats(rid)
    assert stats is not None and first_ms is not None
    history.commit_agent_text(0, "".join(words).strip(), item_id=f"a{n}")
    started = time.perf_counter()  # the reply played out: the window may move on, and is warmed
    after_computed = 0
    if make_room and history.make_room(budget):
        after = await engine.prefill(
            to_messages(history.context(budget)), f"{salt}-h{n}", cache_salt=salt
        )
        after_computed = after.prompt_tokens - after.cached_tokens
    after_ms = (time.perf_counter() - started) * 1000
    window = [e for e in context if e.role is not Role.SYSTEM]
    return {
        "warm_ms": round(warm_ms, 1),
        "warm_computed": warm.prompt_tokens - warm.cached_tokens,
        "first_token_ms": round(first_ms, 1),
        "reply_computed": stats.prompt_tokens - stats.cached_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "after_ms": round(after_ms, 1),
        "after_computed": after_computed,
        "window_turns": len(window),
    }


def shrank(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether the window lost turns between two exchanges (it slid): each adds two."""
    return bool(after["window_turns"] < before["window_turns"] + 2)


def computed(row: dict[str, Any]) -> int:
    """Prompt tokens the engine read for an exchange: warm-ups and reply."""
    return int(row["warm_computed"] + row["reply_computed"] + row["after_computed"])


def summarize(rows: list[dict[str, Any]], full_from: int) -> dict[str, Any]:
    """Medians over the exchanges once the window is full (``full_from`` on), and maxima."""
    late = rows[full_from:]

    def p50(key: str) -> float:
        return round(float(statistics.median(r[key] for r in late)), 1)

    return {
        "exchanges": len(rows),
        "window_full_from": full_from,
        "warm_ms_p50": p50("warm_ms"),
        "warm_ms_max": max(r["warm_ms"] for r in late),
        "first_token_ms_p50": p50("first_token_ms"),
        "first_token_ms_max": max(r["first_token_ms"] for r in late),
        "wait_p50_ms": round(statistics.median(r["warm_ms"] + r["first_token_ms"] for r in late)),
        "after_ms_p50": p50("after_ms"),
        "after_ms_max": max(r["after_ms"] for r in late),
        "computed_tokens_p50": statistics.median(computed(r) for r in late),
        "computed_tokens_total": sum(computed(r) for r in late),
        "slides": sum(1 for a, b in itertools.pairwise(late) if shrank(a, b)),
    }


async def run(exchanges: int, window_tokens: int | None = None) -> dict[str, Any]:
    config = RuntimeConfig()
    budget = config.recent_window_tokens if window_tokens is None else window_tokens
    questions = [q["q"] for q in json.loads(QUESTIONS.read_text())["questions"]]
    histories = {name: History(config.persona, config.max_history_turns) for name in POLICIES}
    for name, (keep, _) in POLICIES.items():
        if keep is not None:
            histories[name].window_keep = keep
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
    engine = await start_engine()
    try:
        for n in range(exchanges):
            question = questions[n % len(questions)]
            order = list(POLICIES) if n % 2 == 0 else list(reversed(POLICIES))
            for name in order:  # they take turns: neither always goes first
                room = POLICIES[name][1]
                row = await exchange(engine, histories[name], question, n, name, budget, room)
                rows[name].append(row)
            print(json.dumps({"n": n, **{name: rows[name][-1] for name in POLICIES}}))
    finally:
        await engine.close()
    # the window is full from the first exchange where turn by turn dropped a turn
    by_turn = rows["turn_by_turn"]
    full_from = next(
        (i for i in range(1, len(by_turn)) if shrank(by_turn[i - 1], by_turn[i])),
        len(by_turn) - 1,
    )
    return {
        "machine": this_machine().describe(),
        "cpu_plan": this_process_plan().describe(),
        "recent_window_tokens": budget,
        **{name: summarize(rows[name], full_from) for name in POLICIES},
        "exchanges": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--exchanges", type=int, default=48)
    parser.add_argument(
        "--window-tokens", type=int, help="the window's budget (runtime.recent_window_tokens)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/long_conversation.json")
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    results = stamped(asyncio.run(run(args.exchanges, args.window_tokens)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "exchanges"}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
