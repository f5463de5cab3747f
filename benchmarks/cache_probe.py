"""The prefix-cache probe, and what isolating the cache per owner costs in first-token time.

The embedded SmolLM2 on vLLM in this process, behind the real voice pipeline (no ASR or TTS:
the LLM stage only); figures are what ``response.timings`` reports (``cached_tokens``, and
``llm_first_token_ms``: from the request to the first text, ms). Two scopes:

- ``shared``: every request in one unsalted prefix cache (the server before the fix);
- ``salted``: each owner's requests salted with its own ``cache_salt`` (the server now).

Probe: session A (owner A) says a PIN. Then, ``--tries`` times, a fresh session of another
owner sends the same words with the right PIN, and one with a wrong PIN (a different one each
try). Right and wrong guesses should read the same cached tokens and first-token time.

Cost: the same conversations in both scopes (a fresh one each try): a session's second turn
(its own first turn cached), and a fresh session's first turn, with the default persona and
with a long persona (which an unsalted cache shares across sessions; salted, it does not).

Run: ``.venv/bin/python -m benchmarks.cache_probe`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import source_commit
from models.llm import GenerationStats, LlmEngine, Message
from models.llm_vllm import VllmEngine
from models.prepare import prepare_llm
from models.tts import split_sentences
from server.clock import MonotonicClock
from server.config import RuntimeConfig
from server.http.auth import token_digest
from server.machine import this_machine
from server.pipeline.seams import ReplyRequest, TurnTrace
from server.pipeline.voice import VoicePipeline
from server.runtime.conditions import Conditions
from server.runtime.history import CacheClass, ContextEntry, Role

PERSONA = RuntimeConfig().persona
LONG_PERSONA = (
    "You are Ada, the voice assistant of a small bank. You speak in short, friendly sentences "
    "because everything you write is read aloud. You help customers with their cards, their "
    "accounts, transfers, standing orders and the opening hours of the branches. You never ask "
    "for a full card number, a PIN or a password, and if a customer offers one you tell them "
    "kindly that you do not need it. When you do not know an answer you say so and offer to "
    "connect the customer with a person. You do not give investment advice. You keep answers "
    "under three sentences unless the customer asks for more detail. Branches open at nine and "
    "close at five on weekdays, and at one on Saturdays. Lost cards can be blocked at any time "
    "by phone. Transfers within the country arrive on the next working day."
)
SECRET = (
    "My bank card PIN is {pin} and my online banking password is blue-harbour-17. Please keep"
    " both safe and remind me of them when I ask about my account later this week, after my"
    " trip to the mountains."
)
RIGHT_PIN = "4821"
TOPICS = [
    "a cat who lived by the sea",
    "a dragon afraid of the dark",
    "a robot learning to paint",
    "a lighthouse keeper's dog",
    "a train that ran on time",
    "a tree that grew upside down",
    "a baker who could not smell",
    "a pirate who hated water",
    "a snail racing a hare",
    "a moon made of cheese",
    "a clock that ran backwards",
    "a violin that sang alone",
]
MAX_TOKENS = 8  # the reply's text is not the point: its first token is


class _Scoped:
    """The shared engine as a pipeline's LLM; ``salted=False`` drops every cache salt (the
    server before the fix). Closing it leaves the engine running."""

    def __init__(self, engine: VllmEngine, salted: bool) -> None:
        self._engine = engine
        self._salted = salted

    def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncIterator[str]:
        salt = cache_salt if self._salted else None
        return self._engine.stream(messages, request_id, max_tokens, cache_salt=salt)

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> GenerationStats:
        salt = cache_salt if self._salted else None
        return await self._engine.prefill(messages, request_id, cache_salt=salt)

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    def last_stats(self, request_id: str) -> GenerationStats | None:
        return self._engine.last_stats(request_id)

    async def close(self) -> None:
        pass


class _NoSpeech:
    def transcribe(self, pcm: object, prefix: str = "") -> str:
        raise AssertionError("the probe runs the LLM stage only")

    def synthesize(self, text: str) -> Any:
        raise AssertionError("the probe runs the LLM stage only")


@dataclass(frozen=True)
class Turn:
    """One reply as ``response.timings`` reports it."""

    cached_tokens: int
    prompt_tokens: int
    first_token_ms: float
    text: str


class Probe:
    """The voice pipeline on the shared engine, in one of the two scopes."""

    def __init__(self, engine: VllmEngine, salted: bool) -> None:
        self.scope = "salted" if salted else "shared"
        llm: LlmEngine = _Scoped(engine, salted)
        self.clock = MonotonicClock()
        self.pipeline = VoicePipeline(
            _NoSpeech(),
            llm,
            _NoSpeech(),
            split_sentences,
            max_tokens=MAX_TOKENS,
            first_chunk_words=6,
            clock=self.clock,
        )
        self._sessions = 0

    def session(self) -> str:
        """A fresh session id (32 characters, as the server's)."""
        self._sessions += 1
        return f"{self.scope}-{self._sessions}".ljust(32, "0")

    async def reply(self, session: str, owner: str, persona: str, *turns: tuple[Role, str]) -> Turn:
        """A reply to ``turns`` after ``persona``, as ``response.timings`` reports it."""
        request = self._request(session, owner, persona, turns)
        trace = TurnTrace(endpoint_ms=self.clock.now_ms())
        text = " ".join([str(chunk) async for chunk in self.pipeline.reply(request, trace)])
        timings = trace.as_dict()
        first = timings["llm_first_token_ms"]
        if first is None:
            raise RuntimeError(f"no token for {session}")
        return Turn(trace.cached_tokens, trace.prompt_tokens, float(first), text)

    async def prefill(self, session: str, owner: str, persona: str, said: str) -> int:
        """The warm-up the server sends when ``said`` is the user's stable partial transcript
        (its cached tokens)."""
        return await self.pipeline.prefill(
            self._request(session, owner, persona, [(Role.USER, said)])
        )

    def _request(
        self, session: str, owner: str, persona: str, turns: Sequence[tuple[Role, str]]
    ) -> ReplyRequest:
        context = [ContextEntry(CacheClass.ANCHOR, Role.SYSTEM, persona)]
        context += [ContextEntry(CacheClass.RECENT, role, text) for role, text in turns]
        conditions = Conditions(persona, "joe", "default")
        return ReplyRequest(session, 0, tuple(context), conditions, owner=owner)

    async def close(self) -> None:
        await self.pipeline.close()


def owner(name: str) -> str:
    return token_digest(f"{name}-token-0123456789")


def summary(turns: list[Turn]) -> dict[str, Any]:
    ms = [t.first_token_ms for t in turns]
    cached = [t.cached_tokens for t in turns]
    return {
        "n": len(turns),
        "cached_tokens_median": statistics.median(cached),
        "cached_tokens": sorted(set(cached)),
        "prompt_tokens_median": statistics.median(t.prompt_tokens for t in turns),
        "first_token_ms_median": round(statistics.median(ms), 1),
        "first_token_ms_min": round(min(ms), 1),
        "first_token_ms_max": round(max(ms), 1),
    }


async def probe(scope: Probe, tries: int) -> dict[str, Any]:
    """A says the PIN; fresh sessions of other owners guess it, right and wrong in turn."""
    await scope.reply(
        scope.session(), owner("alice"), PERSONA, (Role.USER, SECRET.format(pin=RIGHT_PIN))
    )
    right: list[Turn] = []
    wrong: list[Turn] = []
    for i in range(tries):
        guess = SECRET.format(pin=RIGHT_PIN)
        right.append(
            await scope.reply(scope.session(), owner(f"mallory-r{i}"), PERSONA, (Role.USER, guess))
        )
        pin = f"{(1357 + 611 * i) % 10_000:04d}"
        guess = SECRET.format(pin=pin if pin != RIGHT_PIN else "0000")
        wrong.append(
            await scope.reply(scope.session(), owner(f"mallory-w{i}"), PERSONA, (Role.USER, guess))
        )
    return {"right_guess": summary(right), "wrong_guess": summary(wrong)}


async def cost(scope: Probe, tries: int, offset: int) -> dict[str, Any]:
    """Second turns of fresh conversations, and fresh sessions' first turns (default and long
    persona; the long one also after a warm-up with the turn's first words, as the server sends
    while the user speaks); topics start at ``offset`` so that the two scopes never share a
    conversation."""
    second: list[Turn] = []
    fresh: list[Turn] = []
    fresh_long: list[Turn] = []
    warmed_long: list[Turn] = []
    await scope.reply(scope.session(), owner("warm"), LONG_PERSONA, (Role.USER, "Hello."))
    for i in range(tries):
        topic = TOPICS[(offset + i) % len(TOPICS)]
        who, session = owner(f"user-{offset + i}"), scope.session()
        ask = f"Tell me a story about {topic}, number {offset + i}."
        first = await scope.reply(session, who, PERSONA, (Role.USER, ask))
        fresh.append(first)
        turns = ((Role.USER, ask), (Role.ASSISTANT, first.text), (Role.USER, "Why?"))
        second.append(await scope.reply(session, who, PERSONA, *turns))
        # a new owner's session opens with the long persona another owner used before
        ask = f"When does the branch open, question {offset + i}?"
        fresh_long.append(
            await scope.reply(
                scope.session(), owner(f"long-{offset + i}"), LONG_PERSONA, (Role.USER, ask)
            )
        )
        who, session = owner(f"warmed-{offset + i}"), scope.session()
        await scope.prefill(session, who, LONG_PERSONA, "When does the")
        ask = f"When does the branch close, question {offset + i}?"
        warmed_long.append(await scope.reply(session, who, LONG_PERSONA, (Role.USER, ask)))
    return {
        "second_turn": summary(second),
        "first_turn_default_persona": summary(fresh),
        "first_turn_long_persona": summary(fresh_long),
        "first_turn_long_persona_warmed": summary(warmed_long),
    }


async def run(tries: int) -> dict[str, Any]:
    folder = await asyncio.to_thread(prepare_llm)
    started = time.perf_counter()
    engine = await VllmEngine.start(folder)
    results: dict[str, Any] = {
        "machine": this_machine().to_dict(),
        "engine_start_s": round(time.perf_counter() - started, 1),
        "tries": tries,
        "max_tokens": MAX_TOKENS,
        "block_size": engine.options.block_size,
    }
    try:
        warm = Probe(engine, salted=True)  # the engine's first requests are slow: not measured
        for _ in range(2):
            await warm.reply(warm.session(), owner("warm"), PERSONA, (Role.USER, "Hello there."))
        await warm.close()
        for salted in (False, True):
            scope = Probe(engine, salted)
            results[scope.scope] = {
                "probe": await probe(scope, tries),
                "cost": await cost(scope, tries, offset=0 if salted else 100),
            }
            await scope.close()
    finally:
        await engine.close()
    return results


def _line(name: str, figures: dict[str, Any]) -> str:
    return (
        f"  {name:<31} cached {figures['cached_tokens_median']:>5} {figures['cached_tokens']!s:<10}"
        f" first token median {figures['first_token_ms_median']:>7} ms"
        f" ({figures['first_token_ms_min']}-{figures['first_token_ms_max']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 tries (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cache_probe.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    results = asyncio.run(run(3 if args.quick else args.tries))
    results["commit"] = source_commit()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for scope in ("shared", "salted"):
        print(f"{scope} prefix cache ({results['tries']} tries each):")
        for part in ("probe", "cost"):
            for name, figures in results[scope][part].items():
                print(_line(name, figures))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
