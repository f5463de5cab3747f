"""Function calling on a tool set of our own: the right tool with valid arguments, no call where
none was needed, and how long a call takes.

    .venv/bin/python -m benchmarks.tools_bench [--engine | --server] [--split tuning|held_out]
        [--model PATH] [--threads 2] [--limit N] [--sample N] [--out PATH]

The set is ``benchmarks/data/tool_set.json``: five tools an avatar in an app or a game would
have (a lamp, a timer, the weather, the time, the doors), requests that need one of them (each
with the call it needs: the tool's name and a check of its arguments) and requests that need
none (chit-chat, general questions, questions near a tool's topic that it does not answer).
Every item belongs to the ``tuning`` or the ``held_out`` split, fixed in the file: personas and
sampling are tuned on ``tuning`` only, and both are reported. Each request is asked alone (one
user message after the persona) with every tool offered and the choice "auto".

Scores, per split and for both: ``right_pct``, of the requests that need a tool, those whose
reply made exactly one call, of that tool, with arguments that are a JSON object, valid under
the tool's schema and passing the item's check (exact values; free text: a case-insensitive
substring); ``false_call_pct``, of the requests that need none, those whose reply called a
tool. The goals: right >= 90 %, false calls <= 5 %. Every item scored wrong is printed with
what went wrong.

Modes:

- ``--engine`` (the default): the embedded GGUF (``models.prepare.DEFAULT_GGUF``, or
  ``--model PATH``) on :class:`models.llamacpp.LlamaCppEngine` in this process, one slot,
  ``--threads`` threads, through ``stream_tools`` (schema-constrained calls); the server's
  default persona (``RuntimeConfig().persona``) is the system message. One cache scope for the
  whole run, warmed by a first request: each request reuses the persona's and the tools' tokens
  as a session's later turn would. Timed: from the request to the ``ToolCall`` it yields
  (``to_call_ms``), and to the first text of a spoken answer (``to_text_ms``).
- ``--server``: ``python -m server`` (default models and settings, a token) on loopback in a
  network namespace, asked with the ``openai`` package's ``client.realtime.connect()`` on
  ``GET /v1/realtime``, each request in a fresh session: ``session.update`` with the tools
  (GA shape) and ``tool_choice`` "auto", ``--think-s`` (3 s) later the request typed
  (``conversation.item.create`` + ``response.create``). Timed: from sending the request's item to
  ``response.function_call_arguments.done`` (``to_call_ms``); then, once the response is done,
  a plausible result of the tool (``results`` of the set, the call's arguments filled in) sent
  as a ``function_call_output`` item + ``response.create``: from sending it to the first
  ``response.output_audio.delta`` of the spoken answer (``output_to_audio_ms``). A server that
  answers ``unsupported_feature`` to the tools stops the run with a message saying so.

Reported: the scores, p50 and p95 of each time (ms), every item's outcome (calls, arguments,
text). JSON (CPU model, ISA flags, commit) goes to ``benchmarks/results/tools_engine.json`` or
``tools_server.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema

from benchmarks import pct, write_summarised
from benchmarks.clients_bench import wait_no_sessions
from server.machine import this_machine

if TYPE_CHECKING:
    from models.llamacpp import LlamaCppEngine

TOOL_SET = Path(__file__).parent / "data" / "tool_set.json"
RESULTS = Path(__file__).parent / "results"
SPLITS = ("tuning", "held_out")
RIGHT_GOAL_PCT = 90.0  # of the requests that need a tool: the right call, valid arguments
FALSE_CALL_GOAL_PCT = 5.0  # of the requests that need none: a call at most this often
MAX_TOKENS = 128  # a call's arguments, or a spoken answer of one or two sentences
TOKEN = "tools-bench-token-0123456789abcdef"
THINK_S = 3.0  # --server: from the tools set to the request typed (s)
WAIT_S = 120.0  # longest wait for one server event (the default models on a slow machine)
WARM_UP = "Hello."


# ---------------------------------------------------------------- the set and its scoring (pure)


@dataclass(frozen=True)
class Expect:
    """The call a request needs: the tool, and a check of some of its arguments (each an exact
    value or ``{"contains": text}``, a case-insensitive substring of a string)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Request:
    id: str
    text: str
    split: str
    expect: Expect | None  # None: no tool is needed


@dataclass(frozen=True)
class Call:
    """A tool call as the reply made it: the name and the arguments' JSON text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ToolSet:
    tools: list[dict[str, Any]]  # OpenAI Chat shape: {"type": "function", "function": {...}}
    results: dict[str, str]  # tool name -> its answer, arguments as format fields
    requests: list[Request]

    def schema(self, name: str) -> dict[str, Any] | None:
        """The parameters schema of the tool ``name`` (None: no such tool)."""
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return dict(tool["function"].get("parameters") or {"type": "object"})
        return None

    def names(self) -> list[str]:
        return [str(tool["function"]["name"]) for tool in self.tools]

    def realtime_tools(self) -> list[dict[str, Any]]:
        """The tools in the Realtime API's GA shape (the function's fields one level up)."""
        return [{"type": "function", **tool["function"]} for tool in self.tools]


def load_set(path: Path = TOOL_SET) -> ToolSet:
    data = json.loads(path.read_text())
    requests = []
    for item in data["requests"]:
        expect = item.get("expect")
        requests.append(
            Request(
                id=item["id"],
                text=item["text"],
                split=item["split"],
                expect=None if expect is None else Expect(expect["name"], expect["arguments"]),
            )
        )
    return ToolSet(tools=data["tools"], results=data["results"], requests=requests)


def argument_problem(schema: dict[str, Any], check: dict[str, Any], arguments: str) -> str | None:
    """What is wrong with a call's ``arguments`` (JSON text) under the tool's ``schema`` and an
    item's ``check``; None when nothing is."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return f"arguments are not JSON: {arguments[:80]!r}"
    if not isinstance(value, dict):
        return f"arguments are not an object: {arguments[:80]!r}"
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=str)
    if errors:
        return f"arguments break the schema: {errors[0].message}"
    for key, want in check.items():
        if key not in value:
            return f"{key} missing"
        got = value[key]
        if isinstance(want, dict):
            needle = str(want["contains"])
            if not isinstance(got, str) or needle.lower() not in got.lower():
                return f"{key} is {got!r}, without {needle!r}"
        elif got != want or isinstance(got, bool) != isinstance(want, bool):
            return f"{key} is {got!r}, not {want!r}"
    return None


def judge(request: Request, calls: Sequence[Call], tool_set: ToolSet) -> str | None:
    """What is wrong with the calls a reply made to ``request``; None when they are right: none
    for a request that needs no tool; exactly one, the expected tool with arguments that pass
    :func:`argument_problem`, for one that does."""
    expect = request.expect
    if expect is None:
        return f"called {calls[0].name} where no tool was needed" if calls else None
    if not calls:
        return "no call"
    if len(calls) > 1:
        return f"{len(calls)} calls ({', '.join(c.name for c in calls)}) where one was needed"
    call = calls[0]
    if call.name != expect.name:
        return f"called {call.name}, not {expect.name}"
    schema = tool_set.schema(call.name)
    assert schema is not None
    return argument_problem(schema, expect.arguments, call.arguments)


@dataclass(frozen=True)
class Outcome:
    """One request's result: ``problem`` None when it was right (an error counts as wrong, and
    as a call only where one was made)."""

    split: str
    needs_tool: bool
    called: bool
    problem: str | None


def share(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def score(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Per split (in order of first appearance) and ``all``: the requests that need a tool and
    how many were right (``right_pct``), those that need none and how many called one
    (``false_call_pct``), and whether both goals are met."""
    splits = list(dict.fromkeys(o.split for o in outcomes))
    found: dict[str, dict[str, Any]] = {}
    for split in [*splits, "all"]:
        part = [o for o in outcomes if split in ("all", o.split)]
        tool = [o for o in part if o.needs_tool]
        free = [o for o in part if not o.needs_tool]
        right = sum(o.problem is None for o in tool)
        false_calls = sum(o.called for o in free)
        right_pct, false_pct = share(right, len(tool)), share(false_calls, len(free))
        found[split] = {
            "tool_requests": len(tool),
            "right": right,
            "right_pct": right_pct,
            "no_tool_requests": len(free),
            "false_calls": false_calls,
            "false_call_pct": false_pct,
            "meets_goals": right_pct is not None
            and right_pct >= RIGHT_GOAL_PCT
            and (false_pct is None or false_pct <= FALSE_CALL_GOAL_PCT),
        }
    return found


def tool_result(tool_set: ToolSet, call: Call) -> str:
    """A plausible answer of the tool to ``call``: its template with the arguments in it."""

    class Blank(dict[str, Any]):
        def __missing__(self, key: str) -> str:
            return "unknown"

    template = tool_set.results.get(call.name, "Done.")
    with contextlib.suppress(ValueError):
        value = json.loads(call.arguments or "{}")
        if isinstance(value, dict):
            return template.format_map(Blank(value))
    return template.format_map(Blank())


def timing(samples: list[float]) -> dict[str, Any]:
    """p50 and p95 (nearest rank) of ``samples`` (ms), and how many."""
    if not samples:
        return {"n": 0, "p50_ms": None, "p95_ms": None}
    return {
        "n": len(samples),
        "p50_ms": round(pct(samples, 0.5), 1),
        "p95_ms": round(pct(samples, 0.95), 1),
    }


def outcome_of(request: Request, row: dict[str, Any], tool_set: ToolSet) -> Outcome:
    """Judge ``row`` (its ``calls``, an ``error`` if the request failed) and note the problem
    in it."""
    calls = [Call(c["name"], c["arguments"]) for c in row["calls"]]
    problem = judge(request, calls, tool_set)
    if row.get("error"):
        problem = f"error: {row['error']}"
    row["problem"] = problem
    return Outcome(request.split, request.expect is not None, bool(calls), problem)


# ---------------------------------------------------------------- the engine in this process


async def ask_engine(
    engine: LlamaCppEngine,
    persona: str,
    text: str,
    tool_set: ToolSet,
    request_id: str,
    max_tokens: int,
) -> dict[str, Any]:
    """One request alone after the persona; its calls, text and times (ms from the request)."""
    messages = [{"role": "system", "content": persona}, {"role": "user", "content": text}]
    started = time.perf_counter()
    calls: list[dict[str, Any]] = []
    said: list[str] = []
    to_text: float | None = None
    async for piece in engine.stream_tools(
        messages,
        request_id,
        max_tokens,
        tools=tool_set.tools,
        choice="auto",
        cache_salt="tools-bench",
    ):
        at = (time.perf_counter() - started) * 1000
        if isinstance(piece, str):
            if piece and to_text is None:
                to_text = at
            said.append(piece)
        else:
            calls.append({"name": piece.name, "arguments": piece.arguments, "at_ms": round(at, 1)})
    stats = engine.last_stats(request_id)
    return {
        "calls": calls,
        "text": "".join(said).strip(),
        "to_text_ms": None if to_text is None else round(to_text, 1),
        "total_ms": round((time.perf_counter() - started) * 1000, 1),
        "prompt_tokens": None if stats is None else stats.prompt_tokens,
        "cached_tokens": None if stats is None else stats.cached_tokens,
        "output_tokens": None if stats is None else stats.output_tokens,
        "finish": None if stats is None else stats.finish_reason,
    }


async def run_engine(
    tool_set: ToolSet, requests: list[Request], model: Path, args: argparse.Namespace
) -> dict[str, Any]:
    from models.gguf_models import model_of_file
    from models.llamacpp import LlamaCppEngine, LlamaCppOptions
    from server.config import RuntimeConfig

    persona = args.persona or RuntimeConfig().persona
    embedded = model_of_file(model)
    gate = args.call_gate if args.call_gate >= 0 else embedded and embedded.call_gate
    options = LlamaCppOptions(
        slots=1, threads=args.threads, batch_threads=args.threads, call_gate=gate or None
    )
    engine = await LlamaCppEngine.start(model, options)
    rows: list[dict[str, Any]] = []
    outcomes: list[Outcome] = []
    load = os.getloadavg()[0]
    try:
        warm = await ask_engine(engine, persona, WARM_UP, tool_set, "warm-up", 8)
        for n, request in enumerate(requests):
            got = await ask_engine(
                engine, persona, request.text, tool_set, f"tools-{n}", args.max_tokens
            )
            row = {"id": request.id, "split": request.split, "text": request.text, **got}
            outcomes.append(outcome_of(request, row, tool_set))
            rows.append(row)
            print(line(request, row), flush=True)
    finally:
        await engine.close()
    to_call = [row["calls"][0]["at_ms"] for row in rows if row["calls"]]
    to_text = [row["to_text_ms"] for row in rows if row["to_text_ms"] is not None]
    return {
        "what": "stream_tools of the embedded llama.cpp engine in process, choice auto",
        "model": str(model),
        "persona": persona,
        "call_gate": gate or None,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "loadavg_1m_at_start": round(load, 2),
        "warm_up": warm,
        "summary": {
            "scores": score(outcomes),
            "to_call_ms": timing(to_call),
            "to_text_ms": timing(to_text),
        },
        "wrong": wrong(rows),
        "items": rows,
    }


# ---------------------------------------------------------------- the server over /v1/realtime


class Unsupported(RuntimeError):
    """The server refused the tools (``unsupported_feature``)."""


class Events:
    """One Realtime connection's server events as they come (arrival time, event)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._new = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                raw = await self.connection.recv_bytes()
                self.events.append((time.monotonic(), json.loads(raw)))
                self._new.set()
        except Exception:
            return

    async def wait(self, kind: str, after: int) -> tuple[float, dict[str, Any]]:
        """The first ``kind`` event from index ``after`` on; an ``error`` event before it
        raises (:class:`Unsupported` for ``unsupported_feature``)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            for at, event in self.events[after:]:
                if event["type"] == kind:
                    return at, event
                if event["type"] == "error":
                    error = event.get("error") or {}
                    message = f"{error.get('code')}: {error.get('message')} ({error.get('param')})"
                    if error.get("code") == "unsupported_feature":
                        raise Unsupported(message)
                    raise RuntimeError(f"server error while waiting for {kind}: {message}")
            self._new.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind} within {WAIT_S:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    def since(self, after: int, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(at, e) for at, e in self.events[after:] if e["type"] == kind]

    def transcript(self, after: int) -> str:
        return "".join(
            e.get("delta", "")
            for _, e in self.since(after, "response.output_audio_transcript.delta")
        ) or "".join(e.get("delta", "") for _, e in self.since(after, "response.output_text.delta"))

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def ask_server(
    url: str, tool_set: ToolSet, text: str, think_s: float = THINK_S
) -> dict[str, Any]:
    """One request in a fresh session, asked ``think_s`` after the tools were set (the server
    reads the prompt with the tools in the meantime, as it would while a user gets ready);
    its calls, text and times."""
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0)
    row: dict[str, Any] = {"calls": [], "text": "", "to_call_ms": None}
    async with api.realtime.connect(model="gpt-realtime") as connection:
        client = Events(connection)
        try:
            await client.wait("session.created", 0)
            n = len(client.events)
            session: Any = {
                "type": "realtime",
                "tools": tool_set.realtime_tools(),
                "tool_choice": "auto",
            }
            await connection.session.update(session=session)
            _, updated = await client.wait("session.updated", n)
            if not updated.get("session", {}).get("tools"):
                raise Unsupported("session.updated came back without the tools")
            await asyncio.sleep(think_s)  # the user asks a moment after the app connected
            n = len(client.events)
            item: Any = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            }
            asked = time.monotonic()
            await connection.conversation.item.create(item=item)
            await connection.response.create()
            await client.wait("response.done", n)
            row["text"] = client.transcript(n)
            done = client.since(n, "response.function_call_arguments.done")
            row["calls"] = [
                {
                    "name": e.get("name", ""),
                    "arguments": e.get("arguments", ""),
                    "call_id": e.get("call_id"),
                    "at_ms": round((at - asked) * 1000, 1),
                }
                for at, e in done
            ]
            if not row["calls"]:
                return row
            row["to_call_ms"] = row["calls"][0]["at_ms"]
            for call in row["calls"]:  # every call answered, then one response for them all
                call["output"] = tool_result(tool_set, Call(call["name"], call["arguments"]))
            n = len(client.events)
            answered = time.monotonic()
            for call in row["calls"]:
                output: Any = {
                    "type": "function_call_output",
                    "call_id": call["call_id"],
                    "output": call["output"],
                }
                await connection.conversation.item.create(item=output)
            await connection.response.create()
            heard, _ = await client.wait("response.output_audio.delta", n)
            row["output_to_audio_ms"] = round((heard - answered) * 1000, 1)
            await client.wait("response.done", n)
            row["answer"] = client.transcript(n)
            return row
        finally:
            await client.close()


def run_server(
    tool_set: ToolSet, requests: list[Request], think_s: float = THINK_S
) -> dict[str, Any]:
    from tests.support.server_process import ServerProcess

    os.environ.setdefault("TEST_PACE", "1")  # the waits here are this file's own
    server = ServerProcess(env={"AVATAR_SERVER_AUTH_TOKENS": TOKEN})
    started = time.monotonic()
    server.start(timeout=600)
    ready_s = round(time.monotonic() - started, 1)
    print(f"server ready in {ready_s} s", flush=True)
    rows: list[dict[str, Any]] = []
    outcomes: list[Outcome] = []
    load = os.getloadavg()[0]
    try:
        for request in requests:
            try:
                got = asyncio.run(ask_server(server.url, tool_set, request.text, think_s))
            except Unsupported:
                raise
            except Exception as exc:  # a request that fails is scored wrong, and says why
                got = {"calls": [], "text": "", "error": f"{type(exc).__name__}: {exc}"[:300]}
            row = {"id": request.id, "split": request.split, "text": request.text, **got}
            row["sessions_left"] = wait_no_sessions(server)
            outcomes.append(outcome_of(request, row, tool_set))
            rows.append(row)
            print(line(request, row), flush=True)
    finally:
        code = server.stop()
    to_call = [row["to_call_ms"] for row in rows if row.get("to_call_ms") is not None]
    to_audio = [r["output_to_audio_ms"] for r in rows if r.get("output_to_audio_ms") is not None]
    return {
        "what": "GET /v1/realtime with the openai package's client, default models, loopback",
        "think_s": think_s,
        "server_ready_s": ready_s,
        "server_exit_code": code,
        "loadavg_1m_at_start": round(load, 2),
        "summary": {
            "scores": score(outcomes),
            "to_call_ms": timing(to_call),
            "output_to_audio_ms": timing(to_audio),
        },
        "wrong": wrong(rows),
        "items": rows,
    }


# ---------------------------------------------------------------- the run


def line(request: Request, row: dict[str, Any]) -> str:
    """One request's outcome, as printed while the run goes."""
    mark = "ok   " if row["problem"] is None else "WRONG"
    calls = "; ".join(f"{c['name']}({c['arguments']})" for c in row["calls"])
    said = calls or repr(row.get("text", "")[:70])
    why = "" if row["problem"] is None else f"  <- {row['problem']}"
    return f"{mark} [{request.split}] {request.id}: {said}{why}"


def wrong(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items scored wrong: id, split, the request, what went wrong."""
    return [
        {"id": r["id"], "split": r["split"], "text": r["text"], "problem": r["problem"]}
        for r in rows
        if r["problem"] is not None
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tools_bench", description=(__doc__ or "").splitlines()[0]
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--engine", action="store_true", help="llama.cpp in process (default)")
    mode.add_argument("--server", action="store_true", help="python -m server, /v1/realtime")
    parser.add_argument("--split", choices=SPLITS, help="only this split (default: both)")
    parser.add_argument("--model", type=Path, help="a GGUF file (--engine; default: embedded)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (--engine)")
    parser.add_argument(
        "--call-gate",
        type=float,
        default=-1.0,
        help="--engine: LlamaCppOptions.call_gate (0: none; default: the embedded model's)",
    )
    parser.add_argument(
        "--persona", default="", help="the system message (--engine; default: the server's)"
    )
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="per reply (--engine)")
    parser.add_argument("--limit", type=int, default=0, help="the first N requests (0: all)")
    parser.add_argument(
        "--sample", type=int, default=0, help="N requests spread over the set (0: all)"
    )
    parser.add_argument(
        "--think-s", type=float, default=THINK_S, help="--server: tools set -> request (s)"
    )
    parser.add_argument("--out", type=Path, help="default benchmarks/results/tools_<mode>.json")
    args = parser.parse_args(argv)
    if args.server:
        from benchmarks.netns import isolate

        isolate("benchmarks.tools_bench", argv)
    tool_set = load_set()
    requests = [r for r in tool_set.requests if args.split in (None, r.split)]
    requests = requests[: args.limit] if args.limit else requests
    if args.sample and args.sample < len(requests):  # every k-th: each tool, and no-tool ones
        requests = requests[:: len(requests) // args.sample][: args.sample]
    print(f"machine: {this_machine().describe()}", flush=True)
    print(f"{len(requests)} requests, tools {', '.join(tool_set.names())}", flush=True)
    if args.server:
        try:
            result = run_server(tool_set, requests, args.think_s)
        except Unsupported as exc:
            print(
                f"the server does not take these tools (unsupported_feature): {exc}\n"
                "function calling over /v1/realtime is not in this server yet",
                file=sys.stderr,
            )
            return 2
        out = args.out or RESULTS / "tools_server.json"
    else:
        from models.prepare import DEFAULT_GGUF, embedded_gguf

        model = args.model or embedded_gguf(DEFAULT_GGUF)
        result = asyncio.run(run_engine(tool_set, requests, model, args))
        out = args.out or RESULTS / "tools_engine.json"
    result["split"] = args.split or "both"
    for item in result["wrong"]:
        print(f"WRONG [{item['split']}] {item['id']}: {item['text']!r}: {item['problem']}")
    write_summarised(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
