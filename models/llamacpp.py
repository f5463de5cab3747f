"""The CPU engine: llama.cpp in this process (the ``xllamacpp`` wheel), one KV slot per session.

llama.cpp's server core runs in this process on threads of its own; each request blocks one
thread of the engine's own pool (not the event loop's) while its chunks are handed to the
event loop. Behaviour matches :class:`models.llm_vllm.VllmEngine`:

- ``stream`` yields text deltas; closing the stream (a barge-in) stops it: the callback tells
  llama.cpp to stop at the next token, which frees the slot;
- prefix reuse: every cache scope (a ``cache_salt``: one session) gets a slot of its own whose
  KV cache stays between requests, so a reply computes only the tokens after what the slot
  already holds (a prefill's, or the previous turn's). A slot that last served another scope
  is wiped first, so no scope reuses, or can time, another's tokens: it starts again from the
  shared prefix (:meth:`LlamaCppEngine.share_prefix`: the server's default persona, the same
  for every session and nobody's words, computed once and restored in about a millisecond) or,
  without one, from nothing (``cache_prompt: false``);
- several sessions at once: llama.cpp batches the running slots together;
- each request leaves :class:`GenerationStats` (prompt, cached and output tokens, first token).

llama.cpp also starts an HTTP listener that cannot be switched off; it listens on a unix socket
in a private (0700) folder, with a random API key, and its metrics and web UI are off. Its
slot actions are on: the engine saves the shared prefix there and restores it into a slot
(files only in that folder).
The prompt cache in host memory, shared across slots, is off too (it would share prefixes
between scopes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import http.client
import json
import logging
import math
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.llm import (
    GenerationStats,
    LlmError,
    Message,
    StatsBook,
    StreamTally,
    check_salt,
    elapsed_ms,
    words_open_text,
)
from models.prompt_text import ChatText
from models.tool_calls import (
    CALL_FORMS,
    CallScanner,
    Tool,
    ToolCall,
    call_schema,
    check_call,
    tool_parameters,
)

if TYPE_CHECKING:
    import xllamacpp

log = logging.getLogger(__name__)
EOT_TOP_TOKENS = 20  # top tokens returned with an end-of-turn probability
SENTENCE_END = ".?!"  # a token beginning with one of these ends a sentence
SHARED_PREFIX_FILE = "shared-prefix.bin"  # in the engine's private folder
SHARED_SCOPE = "\x00shared-prefix"  # the slot scope that computes it (no cache_salt is this)
SLOT_ACTION_TIMEOUT_S = 30.0  # a save or restore waits for the batch running before it

MAX_CALLS = 4  # tool calls in one reply
CALL_MAX_TOKENS = 256  # a call's JSON may take this many tokens, past the reply's max_tokens

_END = object()  # the sentinel that ends a request's chunk queue


@dataclass(frozen=True)
class LlamaCppOptions:
    """llama.cpp settings; threads come from the CPU plan.

    ``slots``: sessions whose KV caches are kept at once (and requests decoded together);
    ``context_tokens``: each slot's context, prompt and reply together.
    ``repeat_penalty`` > 1 makes a small model less likely to loop (1.0: off).
    """

    slots: int = 4
    context_tokens: int = 2048
    threads: int = 1  # decoding
    batch_threads: int = 1  # prompt processing
    temperature: float = 0.0  # 0 = greedy
    repeat_penalty: float = 1.0
    seed: int = 0
    # a reply that may call tools ("auto") starts with its call where the model's probability
    # (0-1) that its first token starts one is at least this, even where it would rather
    # talk first; None: the model's own choice (models.gguf_models.GgufModel.call_gate)
    call_gate: float | None = None
    # the model follows the server's safety note (models.gguf_models.GgufModel.safety_note)
    safety_note: bool = False

    def __post_init__(self) -> None:
        assert self.slots >= 1 and self.context_tokens >= 64
        assert self.threads >= 1 and self.batch_threads >= 1


@dataclass(frozen=True)
class SlotLease:
    """A slot given to one request: ``fresh`` when the slot's cache holds another scope's
    tokens (or none), so the request must not reuse them."""

    slot: int
    fresh: bool


class SlotBook:
    """Which cache scope owns which slot (synchronous, no I/O).

    A scope keeps its slot while it is used; a new scope takes the least recently used idle
    slot. A scope's requests run one at a time on its slot (llama.cpp would queue them anyway).
    """

    def __init__(self, slots: int) -> None:
        assert slots >= 1
        self._owner: list[str | None] = [None] * slots  # the scope whose tokens a slot holds
        self._busy = [False] * slots
        self._used = [0] * slots  # a logical clock of last use, for LRU
        self._tick = count(1)
        self._ever = [False] * slots

    @property
    def slots(self) -> int:
        return len(self._owner)

    def busy(self) -> int:
        return sum(self._busy)

    def acquire(self, scope: str) -> SlotLease | None:
        """The slot for ``scope``'s next request; None while no slot can take it (its own slot
        is busy, or every slot is)."""
        if scope in self._owner:
            slot = self._owner.index(scope)
            if self._busy[slot]:
                return None
            return self._take(slot, fresh=False)
        idle = [i for i, busy in enumerate(self._busy) if not busy]
        if not idle:
            return None
        slot = min(idle, key=lambda i: self._used[i])
        self._owner[slot] = scope
        return self._take(slot, fresh=True)

    def _take(self, slot: int, *, fresh: bool) -> SlotLease:
        self._busy[slot] = True
        self._used[slot] = next(self._tick)
        fresh = fresh or not self._ever[slot]
        self._ever[slot] = True
        return SlotLease(slot, fresh)

    def release(self, slot: int) -> None:
        assert self._busy[slot], f"slot {slot} released twice"
        self._busy[slot] = False


@dataclass
class _Request:
    """One running request: its chunk queue and the flag that stops it."""

    queue: asyncio.Queue[Any]
    stop: threading.Event
    done: concurrent.futures.Future[None] | None = None
    held: bool = False  # stopped by its hold, not at its end


# the text of a reply that may call no tool: none of the characters a call starts with (a
# marker, an object, a fenced block, a list); spoken words need none of them
# (and at least one: a model barred from the call it wanted would rather end at once)
NO_CALLS_LARK = "%llguidance {}\nstart: /[^{<`\\[\\]\\s][^{<`\\[\\]]*/\n"
NO_CALLS_GBNF = "root ::= [^{<`\\[\\] \\t\\n] [^{<`\\[\\]]*\n"
# the same words, then perhaps a call's start (where the engine stops the text): a reply's
# words never hold JSON (a small model echoes a function's output as an object otherwise)
WORDS_THEN_CALL_LARK = (
    "%llguidance {}\nstart: TEXT CALL?\nTEXT: /[^{<`\\[\\]]*/\n"
    'CALL: /(<tool_call>|\\{"name")[\\s\\S]*/\n'
)
WORDS_THEN_CALL_GBNF = (
    "root ::= text call?\ntext ::= [^{<`\\[\\]]*\n"
    'call ::= ("<tool_call>" | "{\\"name\\"") [^\\x00]*\n'
)


@dataclass(frozen=True)
class _CallPlan:
    """What a tool-calling request decodes: the prompt (tools listed, the assistant's turn
    opened), the tools, one call's JSON schema, the choice."""

    prompt: str
    tools: Sequence[Tool]
    constraint: dict[str, Any]  # the completion's grammar or json_schema (_call_constraint)
    choice: str
    messages: Sequence[Message] = ()


def _same_call(name: str, arguments: Any) -> tuple[str, str]:
    """A call as compared with another: its name and its arguments' canonical JSON."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return name, arguments
    return name, json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def _calls_made(messages: Sequence[Message]) -> set[tuple[str, str]]:
    """The calls the assistant made since the user last spoke (``tool_calls``)."""
    made: set[tuple[str, str]] = set()
    for message in messages:
        if message.get("role") == "user":
            made.clear()
        for call in message.get("tool_calls") or ():
            function = call.get("function", call)
            made.add(_same_call(str(function.get("name")), function.get("arguments", {})))
    return made


def _call_constraint(schema: dict[str, Any]) -> dict[str, Any]:
    """The completion fields that constrain a call to ``schema``: with llguidance (this
    wheel's grammar engine) a grammar of the object and an optional newline, so that the
    model says whether it goes on (a bare object then another, as Qwen2.5-Coder-0.5B writes
    several) or ends its turn; else llama.cpp's ``json_schema`` (the object alone)."""
    if _llguidance():
        lark = f'%llguidance {{}}\nstart: call "\\n"?\ncall: %json {json.dumps(schema)}\n'
        return {"grammar": lark}
    return {"json_schema": schema}


@functools.cache
def _llguidance() -> bool:
    """Whether this llama.cpp build's grammars are llguidance's (it turns JSON schemas into
    them); asked once."""
    import xllamacpp

    return str(xllamacpp.json_schema_to_grammar("{}")).startswith("%llguidance")


def _text_constraint(calls: bool) -> dict[str, Any]:
    """The completion fields of a reply's words: none of the characters a call or an object
    starts with, then (``calls``) perhaps the start of a call, else nothing more (a bias
    against the tokens that start a call is not enough: the model finds another, ``{\n``)."""
    if _llguidance():
        return {"grammar": WORDS_THEN_CALL_LARK if calls else NO_CALLS_LARK}
    return {"grammar": WORDS_THEN_CALL_GBNF if calls else NO_CALLS_GBNF}


def _call_watch(scanner: CallScanner, peek: bool) -> Callable[[str], bool]:
    """Whether to stop at a delta (in an engine thread): once a call starts, or, to ``peek``
    (after a required call), at any text that starts none."""

    def watch(delta: str) -> bool:
        passed = scanner.feed(delta)
        return scanner.found or (peek and bool(passed.strip()))

    return watch


@dataclass
class _Run:
    """One request as abort() sees it: its slot, the completion running now, and the stop
    flag that all of its completions share (a tool call's request runs several)."""

    request_id: str
    scope: str  # the cache_salt, "" for none
    stop: threading.Event
    started: float = field(default_factory=time.perf_counter)
    lease: SlotLease | None = None
    reuse: bool = False  # the next completion may reuse what the slot holds
    leased: float = 0.0
    request: _Request | None = None
    tallies: list[StreamTally] = field(default_factory=list)
    ttft_ms: float | None = None  # the first text or call

    def first(self) -> None:
        """Something (text or a call) is handed on now: the first time, that is the run's
        first token."""
        if self.ttft_ms is None:
            self.ttft_ms = elapsed_ms(self.started)

    def aborted(self) -> None:
        """The consumer went away (closed or cancelled)."""
        if self.tallies and self.tallies[-1].finish is None:
            self.tallies[-1].finish = "abort"

    def stats(self) -> GenerationStats:
        """The prompt of the first completion that reported one (one held at a call's start
        reports none: then the call's, a few tokens longer), every completion's output
        tokens, the last one's finish."""
        if not self.tallies:
            return GenerationStats(0, 0, 0, self.ttft_ms, None)
        told = [t for t in self.tallies if t.prompt_tokens] or self.tallies
        first, last = told[0], self.tallies[-1]
        out = sum(t.stats().output_tokens for t in self.tallies)
        return GenerationStats(
            first.prompt_tokens, first.cached_tokens, out, self.ttft_ms, last.finish
        )


class LlamaCppEngine:
    """llama.cpp in this process, serving one GGUF model to every session.

    Constructing it loads the model and blocks (about a second); in async code use
    :meth:`start`.
    """

    def __init__(self, model_path: Path, options: LlamaCppOptions | None = None) -> None:
        self.model_path = Path(model_path)
        self.options = options or LlamaCppOptions()
        if not self.model_path.is_file():
            raise LlmError(f"no GGUF model at {self.model_path} (run python -m models.prepare)")
        started = time.perf_counter()
        log.info("loading LLM from %s with llama.cpp", self.model_path)
        self.chat = ChatText.from_gguf(self.model_path)
        self._folder = Path(tempfile.mkdtemp(prefix="llamacpp-"))  # mode 0700
        self._api_key = secrets.token_hex(16)
        self.shared_prefix_tokens = 0  # tokens a fresh slot starts from (share_prefix)
        try:
            self._server = _start_server(self.model_path, self.options, self._folder, self._api_key)
        except Exception as e:
            shutil.rmtree(self._folder, ignore_errors=True)
            raise LlmError(f"could not start llama.cpp on {self.model_path}: {e}") from e
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.options.slots + 1, thread_name_prefix="llamacpp"
        )
        self._book = SlotBook(self.options.slots)
        self._freed = asyncio.Condition()  # binds to a loop at its first use
        self._requests: dict[str, _Run] = {}
        self._stopping: set[asyncio.Future[None]] = set()  # stopped requests' last token
        self._stats = StatsBook()
        self._closed = False
        log.info(
            "LLM ready in %.1f s (llama.cpp, %d slots of %d tokens, %d threads)",
            time.perf_counter() - started,
            self.options.slots,
            self.options.context_tokens,
            self.options.threads,
        )

    @classmethod
    async def start(
        cls, model_path: Path, options: LlamaCppOptions | None = None
    ) -> LlamaCppEngine:
        """Load the model without blocking the event loop."""
        return await asyncio.to_thread(cls, model_path, options)

    def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncGenerator[str, None]:
        """Reply deltas; ``aclose()`` or cancelling the consumer stops the request."""
        return self._generate(self.chat.render(messages), request_id, max_tokens, cache_salt)

    def stream_held(
        self,
        messages: Sequence[Message],
        said: str,
        request_id: str,
        max_tokens: int,
        *,
        hold: Callable[[], bool],
        cache_salt: str | None = None,
    ) -> AsyncGenerator[str, None]:
        """Reply deltas after ``said`` (the reply's words so far, "" for a new reply: then the
        prompt ends right after them, the assistant's turn open; the slot still holds them),
        until the reply ends or ``hold()`` turns true: llama.cpp stops at that token, and the
        request's finish reason is "held". ``hold`` is called at every token, in an engine
        thread: it must only read."""
        if said:
            chat = [*messages, {"role": "assistant", "content": said}]
            prompt = words_open_text(self.chat.render, chat)
        else:
            prompt = self.chat.render(messages)
        return self._generate(prompt, request_id, max_tokens, cache_salt, hold)

    @property
    def takes_safety_note(self) -> bool:
        """Whether the model follows a system note after the user's words (rather than read
        it aloud): the server's safety note is given to it."""
        return self.options.safety_note

    @property
    def calls_tools(self) -> bool:
        """Whether the model's chat template writes function calls (:meth:`stream_tools`)."""
        return self.chat.calls_tools

    def stream_tools(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        tools: Sequence[Tool],
        choice: str = "auto",
        cache_salt: str | None = None,
    ) -> AsyncGenerator[str | ToolCall, None]:
        """Reply text deltas and :class:`ToolCall` s, the tools (OpenAI Chat-style) in the
        prompt.

        ``choice``: "auto" decodes freely and, where the model starts a call (``<tool_call>``,
        or a bare ``{"name"`` opening the reply), stops and decodes the call constrained to
        the tools' schemas (llama.cpp's ``json_schema`` grammar), validates it
        (:func:`models.tool_calls.check_call`), yields it and goes on after it: more calls
        (up to :data:`MAX_CALLS`) or text; a reply to a call's output (the chat's last message
        is a ``tool`` one) talks, no call allowed to start. A call the assistant made already
        since the user last spoke (the same name and arguments: a small model repeats the call
        it has just been answered) is not made again: the reply talks instead, no call allowed
        to start
        (:data:`NO_CALLS_LARK`). "required" starts with a call, a tool's name with a call of
        that tool; the stream ends after the call(s). "none": the tools stay in the prompt (as in
        every request of the conversation, so its prefix stays cached) and the reply talks,
        no call allowed to start. No tools: :meth:`stream`. A call that fails validation is
        logged and ends the reply; none is ever yielded. ``max_tokens`` bounds the text; a
        call may take up to :data:`CALL_MAX_TOKENS` beyond it. One slot and one
        ``request_id`` (abort(), last_stats()) for all of it; closing the stream stops
        whichever part runs. ValueError-like mistakes (an unknown choice, a tool that is no
        function) raise LlmError here, before the stream starts."""
        if not tools:
            return self.stream(messages, request_id, max_tokens, cache_salt=cache_salt)
        try:
            names = tool_parameters(tools)
        except ValueError as e:
            raise LlmError(f"bad tools: {e}") from e
        if choice not in ("auto", "required", "none") and choice not in names:
            raise LlmError(f"tool choice {choice!r}: not auto, none, required or a tool's name")
        if not self.chat.calls_tools:
            raise LlmError(f"the chat template of {self.model_path.name} makes no tool calls")
        only = None if choice in ("auto", "required", "none") else choice
        constraint = _call_constraint(call_schema(tools, only))
        prompt = self.chat.render(messages, tools)
        plan = _CallPlan(prompt, tools, constraint, choice, tuple(messages))
        return self._generate_tools(plan, request_id, max_tokens, cache_salt)

    async def _generate_tools(
        self, plan: _CallPlan, request_id: str, max_tokens: int, cache_salt: str | None
    ) -> AsyncGenerator[str | ToolCall, None]:
        run = self._begin(request_id, cache_salt)
        reply = ""  # the assistant's turn so far, as the prompt continues it
        left = max(1, max_tokens)  # text tokens left
        calls = 0
        try:
            await self._seat(run)
            free = plan.choice in ("auto", "none")
            form = "marker"  # how the model writes its calls (the canonical form to start)
            made = _calls_made(plan.messages)  # since the user last spoke: not made again
            # no call may start: "none", or (auto) a reply to a call's output, which a small
            # model answers with the same call again; it speaks from the output
            answers = bool(plan.messages) and plan.messages[-1].get("role") == "tool"
            talk = plan.choice == "none" or (plan.choice == "auto" and answers)
            gate = self.options.call_gate
            if gate is not None and plan.choice == "auto" and not talk:
                chance = await self._call_start_probability(run, plan.prompt)
                free = chance < gate
                log.debug("request %s: a call starts at p=%.4f (gate %g)", request_id, chance, gate)
            while not run.stop.is_set():
                if free:  # text, until the model starts a call
                    scanner = CallScanner()
                    watcher = CallScanner()
                    # after a required call: another, or the end
                    peek = plan.choice not in ("auto", "none")
                    watch = _call_watch(watcher, peek)
                    barred = _text_constraint(calls=not talk)
                    async for delta in self._complete(
                        run, plan.prompt + reply, left, watch, barred
                    ):
                        text = scanner.feed(delta)
                        if text and not peek:
                            run.first()
                            yield text
                    left -= run.tallies[-1].stats().output_tokens
                    if not scanner.found:
                        rest = scanner.flush()
                        if rest and not peek and (not calls or rest.strip()):
                            run.first()
                            yield rest
                        break
                    reply += scanner.before
                    form = scanner.form
                    if talk:  # a start the bias did not bar: the reply ends before it
                        log.info("request %s: a call began where none may", request_id)
                        break
                if calls >= MAX_CALLS or run.stop.is_set():
                    break
                opening, closing = CALL_FORMS[form]
                if form == "marker":  # as the template writes it
                    reply = reply.rstrip()
                    reply += "\n" if reply else ""
                reply += opening
                started = time.perf_counter()
                pieces = [
                    piece
                    async for piece in self._complete(
                        run,
                        plan.prompt + reply,
                        max(left, CALL_MAX_TOKENS),
                        extra=plan.constraint,
                    )
                ]
                if run.stop.is_set():
                    break
                text = "".join(pieces)
                body = text.removesuffix("\n")  # the grammar's optional end: go on
                call = check_call(body, plan.tools)
                log.debug(
                    "request %s: call %d decoded in %.0f ms: %s",
                    request_id,
                    calls + 1,
                    elapsed_ms(started),
                    call,
                )
                if call is None:
                    break  # logged by check_call
                same = _same_call(call.name, call.arguments)
                if same in made and plan.choice == "auto":
                    # a small model calls again what it has just been answered: it talks now
                    log.info("request %s: %s made again; the reply talks", request_id, call.name)
                    talk, free = True, True
                    reply = reply.removesuffix(opening)
                    continue
                made.add(same)
                calls += 1
                run.first()
                yield call
                if plan.choice not in ("auto", "required") or left <= 0:
                    break
                if form == "bare" and body == text:
                    break  # the model ended its turn right after the object
                reply += body + closing  # in the model's own form: it goes on as it began
                free = True
        except (GeneratorExit, asyncio.CancelledError):
            run.aborted()
            raise
        finally:
            await self._end(run)

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> GenerationStats:
        """Compute the prompt stream() would send into the scope's slot (one token generated
        and dropped); a later stream() of the same or a longer chat reuses it."""
        generation = self._generate(self.chat.render(messages), request_id, 1, cache_salt)
        return await self._stats.drain(generation, request_id)

    async def prefill_open(
        self,
        messages: Sequence[Message],
        request_id: str,
        *,
        cache_salt: str | None = None,
        paused: bool = False,
    ) -> GenerationStats:
        """Warm the scope's slot while the last message is still being said.

        llama.cpp reuses the longest common token prefix, not whole blocks. While the user
        speaks, the prompt ends right after their words, their turn left open: the next
        warm-up and the reply read only the words after them. At a pause (``paused``) the
        words may be all the turn says, so the assistant's turn is opened too: when the final
        transcript is what was heard last, the reply computes one token; when the user went
        on, the tokens after the first difference (the header again, 5 tokens for Qwen).
        """
        prompt = self.chat.render(messages) if paused else self.chat.render_user_open(messages)
        generation = self._generate(prompt, request_id, 1, cache_salt)
        return await self._stats.drain(generation, request_id)

    async def end_of_turn_probability(
        self, messages: Sequence[Message], *, cache_salt: str | None = None
    ) -> float:
        """The probability (0-1) that the user's last message ends after its words: the
        model's end-of-turn token right after them (one token, in the scope's slot, whose
        prompt is the chat as said so far). It reads the words' final mark more than the
        words (BENCHMARKS.md); ``sentence_end_probability`` reads the words."""
        if self.chat.eos_token_id < 0:
            raise LlmError(f"{self.model_path.name} names no end-of-turn token")
        found = await self._next_token(messages, cache_salt)
        return _token_probability(found, self.chat.eos_token_id)

    async def _call_start_probability(self, run: _Run, prompt: str) -> float:
        """The probability (0-1) that the reply to ``prompt`` starts with a call: one token in
        the run's slot, whose tokens the reply then reuses."""
        assert run.lease is not None
        body = self._body(prompt, 1, run.lease.slot, run.reuse)
        run.reuse = True
        return call_start_probability(await self._unstreamed({**body, "logprobs": EOT_TOP_TOKENS}))

    async def sentence_end_probability(
        self, messages: Sequence[Message], *, cache_salt: str | None = None
    ) -> float:
        """The probability (0-1) that the user's last message is a whole sentence: with its
        final mark taken away ("What is the capital of France"), the model's probability that
        a sentence-final mark (. ? !) comes next. A fragment ("I would like to go to") gets
        next to none. One token in the scope's slot, after the chat as said so far (which
        the warm-ups of the words computed); the reply's prompt shares all of it but the
        mark."""
        *before, last = messages
        words = {**last, "content": unmarked(last["content"])}
        found = await self._next_token([*before, words], cache_salt)
        return mark_probability(found)

    async def _next_token(self, messages: Sequence[Message], cache_salt: str | None) -> list[Any]:
        """llama.cpp's answer, with the top tokens' probabilities, for the one token after
        the chat whose last message is left open."""
        if self._closed:
            raise LlmError("the engine is closed")
        check_salt(cache_salt)
        prompt = self.chat.render_user_open(messages)
        lease = await self._lease(cache_salt if cache_salt is not None else "")
        try:
            reuse = await self._starts_from(lease)
            body = self._body(prompt, 1, lease.slot, reuse)
            return await self._unstreamed({**body, "logprobs": EOT_TOP_TOKENS})
        finally:
            await self._release(lease.slot)

    async def share_prefix(self, messages: Sequence[Message]) -> int:
        """Compute the chat text before the first user message's words once (``messages``:
        the server's default persona, the same for every session) and keep it: a slot that a
        new scope takes starts from it, restored in about a millisecond, instead of reading
        the persona again (0.8-2.7 s of the cores of a 2-core machine, while the user speaks
        their first words). It holds nobody's words, so a scope that times it learns
        only the server's own persona. Returns its tokens; LlmError if it cannot be kept."""
        if self._closed:
            raise LlmError("the engine is closed")
        prompt = words_open_text(self.chat.render, [*messages, {"role": "user", "content": ""}])
        lease = await self._lease(SHARED_SCOPE)
        try:
            found = await self._unstreamed(self._body(prompt, 1, lease.slot, reuse=False))
            refused = [r for r in found if not isinstance(r, dict) or "error" in r]
            if refused or not found:
                raise LlmError(f"llama.cpp did not compute the shared prefix: {refused!r:.200}")
            loop = asyncio.get_running_loop()
            saved = await loop.run_in_executor(self._pool, self._slot_action, lease.slot, "save")
        finally:
            await self._release(lease.slot)
        self.shared_prefix_tokens = int(saved.get("n_saved") or 0)
        return self.shared_prefix_tokens

    async def _unstreamed(self, body: dict[str, Any]) -> list[Any]:
        """Run a completion (``_body``'s) in one piece, in the engine's pool; llama.cpp's
        answers as they came."""
        body = {**body, "stream": False}
        body.pop("stream_options")
        found: list[Any] = []
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._server.handle_completions, body, found.append)
        return found

    async def _starts_from(self, lease: SlotLease) -> bool:
        """Make ``lease``'s slot ready; whether the request may reuse what it then holds: the
        scope's own tokens, or the shared prefix restored over another scope's (theirs are
        gone either way). A restore that fails leaves the slot to be wiped."""
        if not lease.fresh:
            return True
        if not self.shared_prefix_tokens:
            return False
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._pool, self._slot_action, lease.slot, "restore")
        except LlmError as e:
            log.warning("slot %d starts from nothing: %s", lease.slot, e)
            return False
        return True

    def _slot_action(self, slot: int, action: str) -> dict[str, Any]:
        """Save the slot's tokens to the shared prefix file, or restore it into the slot
        (blocking: llama.cpp does it between two batches); its answer, LlmError if refused."""
        connection = _UnixHttp(self._folder / "llm.sock", SLOT_ACTION_TIMEOUT_S)
        headers = {"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json"}
        body = json.dumps({"filename": SHARED_PREFIX_FILE})
        try:
            connection.request("POST", f"/slots/{slot}?action={action}", body, headers)
            response = connection.getresponse()
            status, answer = response.status, response.read()
        except OSError as e:
            raise LlmError(f"llama.cpp slot {slot} {action}: {e}") from e
        finally:
            connection.close()
        if status != 200:
            raise LlmError(f"llama.cpp refused slot {slot} {action}: {answer[:200]!r}")
        return dict(json.loads(answer))

    async def _lease(self, scope: str) -> SlotLease:
        async with self._freed:
            while (lease := self._book.acquire(scope)) is None:
                await self._freed.wait()
            return lease

    async def _release(self, slot: int) -> None:
        async with self._freed:
            self._book.release(slot)
            self._freed.notify_all()

    async def _generate(
        self,
        prompt: str,
        request_id: str,
        max_tokens: int,
        cache_salt: str | None,
        hold: Callable[[], bool] | None = None,
    ) -> AsyncGenerator[str, None]:
        run = self._begin(request_id, cache_salt)
        try:
            await self._seat(run)
            watch = None if hold is None else (lambda _text: hold())
            async for text in self._complete(run, prompt, max_tokens, watch):
                if run.ttft_ms is None:
                    run.ttft_ms = elapsed_ms(run.started)
                yield text
        except (GeneratorExit, asyncio.CancelledError):
            run.aborted()
            raise
        finally:
            await self._end(run)

    def _begin(self, request_id: str, cache_salt: str | None) -> _Run:
        """Check and register a request (abort() finds it by ``request_id``)."""
        if self._closed:
            raise LlmError("the engine is closed")
        if request_id in self._requests:
            raise LlmError(f"request {request_id} is already running")
        check_salt(cache_salt)
        run = _Run(request_id, cache_salt if cache_salt is not None else "", threading.Event())
        self._requests[request_id] = run
        return run

    async def _seat(self, run: _Run) -> None:
        """Lease the run's slot (waiting while its scope's, or every, slot is busy)."""
        run.lease = await self._lease(run.scope)
        run.reuse = await self._starts_from(run.lease)
        run.leased = time.perf_counter()

    async def _complete(
        self,
        run: _Run,
        prompt: str,
        max_tokens: int,
        watch: Callable[[str], bool] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> AsyncGenerator[str, None]:
        """One completion in the run's slot: its text deltas, until it ends, the run is
        stopped, or ``watch`` (called with each delta in an engine thread) turns true: then
        llama.cpp stops at that token and the completion's finish is "held". ``extra``: more
        fields of the completion's body (a ``json_schema``). Its tally joins the run's."""
        assert run.lease is not None
        if run.stop.is_set():
            return
        request = _Request(asyncio.Queue(), run.stop)
        tally = StreamTally()
        run.request = request
        run.tallies.append(tally)
        body = {**self._body(prompt, max_tokens, run.lease.slot, run.reuse), **(extra or {})}
        run.reuse = True  # the slot holds this run's tokens now
        request.done = self._submit(body, request, watch)
        async for text in self._chunks(request, tally, run.request_id):
            yield text
        if request.held and tally.finish is None:
            tally.finish = "held"
        if not run.stop.is_set():  # (a stopped one ends by itself: _end waits for it)
            await asyncio.wrap_future(request.done)  # llama.cpp is done with the slot

    async def _end(self, run: _Run) -> None:
        """Stop what still runs, give the slot back, record the run's stats."""
        request = run.request
        run.stop.set()  # llama.cpp stops at its next token and frees its slot
        if request is not None and request.done is not None and not request.done.done():
            # the stream ends now; the engine owns the thread until that token
            stopping = asyncio.wrap_future(request.done)
            self._stopping.add(stopping)
            stopping.add_done_callback(self._stopping.discard)
        if run.lease is not None:
            await self._release(run.lease.slot)
        self._requests.pop(run.request_id, None)
        last = run.tallies[-1] if run.tallies else None
        if last is not None and request is not None and request.held and last.finish is None:
            last.finish = "held"
        if last is not None and last.finish is None:
            last.finish = "abort"  # stopped (abort, close, or the consumer gone)
        stats = run.stats()
        self._stats.put(run.request_id, stats)
        if run.lease is not None and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %s: slot %d after %.0f ms; %d prompt tokens (%d cached), first"
                " token at %s ms, %d out in %d completions, %.0f ms in all (%s)",
                run.request_id,
                run.lease.slot,
                (run.leased - run.started) * 1000.0,
                stats.prompt_tokens,
                stats.cached_tokens,
                "-" if stats.ttft_ms is None else f"{stats.ttft_ms:.0f}",
                stats.output_tokens,
                len(run.tallies),
                (time.perf_counter() - run.started) * 1000.0,
                stats.finish_reason,
            )

    def _body(self, prompt: str, max_tokens: int, slot: int, reuse: bool) -> dict[str, Any]:
        """A completion in ``slot``; ``reuse``: the common prefix of what the slot holds may
        be reused (the scope's own tokens, or the shared prefix restored into it)."""
        return {  # a prompt longer than a slot's context is refused with an error chunk
            "prompt": prompt,
            "max_tokens": max(1, max_tokens),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.options.temperature,
            "repeat_penalty": self.options.repeat_penalty,
            "seed": self.options.seed,
            "id_slot": slot,
            "cache_prompt": reuse,
        }

    def _submit(
        self, body: dict[str, Any], request: _Request, watch: Callable[[str], bool] | None = None
    ) -> concurrent.futures.Future[None]:
        loop = asyncio.get_running_loop()
        put = request.queue.put_nowait

        def on_chunk(chunk: Any) -> bool:
            loop.call_soon_threadsafe(put, chunk)
            if watch is not None and not request.stop.is_set() and watch(_chunk_text(chunk)):
                request.held = True  # read once the stream has ended
            return request.stop.is_set() or request.held

        def run() -> None:
            try:
                self._server.handle_completions(body, on_chunk)
            except BaseException as e:  # handed to the consumer, who raises LlmError
                loop.call_soon_threadsafe(put, e)
            finally:
                loop.call_soon_threadsafe(put, _END)

        return self._pool.submit(run)

    async def _chunks(
        self, request: _Request, tally: StreamTally, request_id: str
    ) -> AsyncGenerator[str, None]:
        while (chunk := await request.queue.get()) is not _END:
            if isinstance(chunk, BaseException):
                raise LlmError(f"llama.cpp request {request_id} failed: {chunk}") from chunk
            text = tally.apply(chunk, f"llama.cpp request {request_id}")
            if text:
                yield text

    async def abort(self, request_id: str) -> None:
        """Stop a running request at its next token; its stream ends with finish "abort"."""
        run = self._requests.get(request_id)
        if run is not None:
            run.stop.set()
            if run.request is not None:
                run.request.queue.put_nowait(_END)

    def last_stats(self, request_id: str) -> GenerationStats | None:
        return self._stats.get(request_id)

    def running(self) -> int:
        """Requests not yet finished (0 once every stream ended or was stopped)."""
        return len(self._requests)

    async def close(self) -> None:
        """Stop every request, then llama.cpp's threads; streams still running end."""
        if self._closed:
            return
        self._closed = True
        for request_id in list(self._requests):
            await self.abort(request_id)
        await asyncio.gather(*self._stopping)
        started = time.perf_counter()
        await asyncio.to_thread(self._shutdown)
        log.info("LLM engine shut down in %.1f s", time.perf_counter() - started)

    def _shutdown(self) -> None:
        self._pool.shutdown(wait=True)
        del self._server  # its destructor ends llama.cpp's loop and joins its threads
        shutil.rmtree(self._folder, ignore_errors=True)


class _UnixHttp(http.client.HTTPConnection):
    """HTTP/1.1 to llama.cpp's listener on its private unix socket."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._path))
        self.sock = sock


def _chunk_text(chunk: Any) -> str:
    """A streamed completion chunk's text ("" for none)."""
    try:
        return str(chunk["choices"][0].get("text") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""


def _top_tokens(responses: list[Any]) -> list[dict[str, Any]]:
    """The top tokens (with ``id``, ``token`` and ``logprob``) of the first generated token;
    LlmError for an error response or none."""
    for response in responses:
        if not isinstance(response, dict):
            continue
        if "error" in response:
            raise LlmError(f"llama.cpp: {response['error']}")
        for choice in response.get("choices", []):
            content = (choice.get("logprobs") or {}).get("content") or []
            return list(content[0].get("top_logprobs", [])) if content else []
    raise LlmError("llama.cpp returned no token probabilities")


def _token_probability(responses: list[Any], token_id: int) -> float:
    """The probability of ``token_id`` as the first generated token (0 when it is not among
    the top tokens returned); LlmError for an error response."""
    for top in _top_tokens(responses):
        if top.get("id") == token_id:
            return math.exp(float(top["logprob"]))
    return 0.0


def _top_probability(responses: list[Any], counts: Callable[[str], bool]) -> float:
    """The probability (at most 1) of the top tokens of the first generated token whose text,
    spaces stripped, ``counts``."""
    total = 0.0
    for top in _top_tokens(responses):
        if counts(str(top.get("token", "")).strip()):
            total += math.exp(float(top["logprob"]))
    return min(1.0, total)


def call_start_probability(responses: list[Any]) -> float:
    """The probability that the first generated token starts a call: the top tokens that
    begin with the template's ``<tool_call>`` or a bare object's ``{`` (after spaces)."""
    return _top_probability(responses, lambda text: text.startswith(("<tool_call>", "{")))


def mark_probability(responses: list[Any]) -> float:
    """The probability that the first generated token ends a sentence: the top tokens that
    begin with ". ? !" (after spaces), but not an ellipsis ("..."), which trails off."""
    return _top_probability(
        responses,
        lambda text: bool(text) and text[0] in SENTENCE_END and not text.startswith(".."),
    )


def unmarked(words: str) -> str:
    """``words`` without the marks and spaces at their end ("Paris?" -> "Paris")."""
    return words.rstrip(" \t\n.?!,;:…")


def _start_server(
    model_path: Path, options: LlamaCppOptions, folder: Path, api_key: str
) -> xllamacpp.Server:
    """llama.cpp's server core, its HTTP listener on a private unix socket (``folder``), slot
    files saved and restored only in that folder."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.n_parallel = options.slots
    params.n_ctx = options.slots * options.context_tokens  # split evenly between the slots
    params.kv_unified = False
    params.cpuparams.n_threads = options.threads
    params.cpuparams_batch.n_threads = options.batch_threads
    params.cache_ram_mib = 0  # no prompt cache shared between slots
    params.hostnames = [str(folder / "llm.sock")]
    params.api_keys = [api_key]
    params.endpoint_slots = True  # save and restore the shared prefix (share_prefix)
    params.slot_save_path = f"{folder}/"  # llama.cpp joins it to a file name as it is
    params.endpoint_metrics = False
    params.ui = False
    params.warmup = True
    params.verbosity = -1
    return xllamacpp.Server(params)
