"""LLM backends behind a small Protocol: in-process vLLM (shared by all sessions) or a remote one.

Plain types only: a chat is a sequence of ``{"role": ..., "content": ...}`` dicts, replies stream
as text deltas and a finished request leaves its :class:`GenerationStats`. Times are in ms.

The prefix cache is shared by every request of an engine; a request's ``cache_salt`` scopes it:
a request reuses cached KV blocks only of requests with the same salt (None: the unsalted
scope). Without salts, whether (and how fast) a prompt hits the cache tells one caller what
another one's prompt began with.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiohttp

from models.replicas import Replica, ReplicaSet, ReplicaStatus, prompt_key

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)
Dtype = Literal["bfloat16", "float32", "auto"]  # what an in-process vLLM computes in

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STATS_KEPT = 256  # finished requests whose stats last_stats() still answers
SALT_MAX_CHARS = 128  # vLLM's limit on a cache_salt
SALT_FORBIDDEN = frozenset("@/\\\x00")  # characters vLLM's server refuses in a cache_salt
OPEN_MARK = "\ue000"  # a private-use character: where an open message's words end
LAST_WORD = re.compile(r"\s*\S+\s*$")


class LlmError(Exception):
    """An LLM request or engine failed (bad prompt, engine dead, HTTP error, timeout)."""


@dataclass(frozen=True)
class GenerationStats:
    """What one request cost, reported when its stream ends.

    ``cached_tokens``: prompt tokens served from the prefix cache (whole KV blocks).
    ``ttft_ms``: from submitting the request (the stream's first iteration) to the first
    generated token; None when none came.
    ``finish_reason``: "stop", "length", "abort", or None when the stream broke off.
    """

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_ms: float | None
    finish_reason: str | None


class LlmEngine(Protocol):
    """A chat model that streams replies; one engine serves many concurrent requests.

    ``cache_salt``: the request's prefix-cache scope (1-128 characters, none of ``@ / \\``
    or NUL); it reuses cached blocks only of requests with the same salt. None: unsalted.
    """

    def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncIterator[str]:
        """Text deltas of the reply; closing or cancelling the iterator aborts the request."""
        ...

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> GenerationStats:
        """Warm the prefix cache with the prompt stream() would send (one token generated);
        only requests with the same ``cache_salt`` reuse it."""
        ...

    async def abort(self, request_id: str) -> None:
        """End a running request; its stream stops with finish_reason "abort"."""
        ...

    def last_stats(self, request_id: str) -> GenerationStats | None:
        """Stats of a recently finished request, None if unknown."""
        ...

    async def close(self) -> None: ...


class _StatsBook:
    """A bounded request_id -> GenerationStats map (oldest entries are forgotten)."""

    def __init__(self, capacity: int = STATS_KEPT) -> None:
        self._capacity = capacity
        self._stats: OrderedDict[str, GenerationStats] = OrderedDict()

    def put(self, request_id: str, stats: GenerationStats) -> None:
        self._stats[request_id] = stats
        self._stats.move_to_end(request_id)
        while len(self._stats) > self._capacity:
            self._stats.popitem(last=False)

    def get(self, request_id: str) -> GenerationStats | None:
        return self._stats.get(request_id)


async def _one_token(
    generation: AsyncGenerator[str, None], book: _StatsBook, request_id: str
) -> GenerationStats:
    """Run a max_tokens=1 generation (a prefix-cache warm-up) and return its stats."""
    async for _ in generation:
        pass
    stats = book.get(request_id)
    if stats is None:  # pragma: no cover - _generate always records
        raise LlmError(f"prefill {request_id} left no stats")
    return stats


def settled_words(content: str) -> str:
    """The words of a message still being said, less the last one, which may still grow (a
    recogniser may continue " park" as " parking"); a character prefix of ``content``."""
    return LAST_WORD.sub("", content)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def open_text(render: Callable[[Sequence[Message]], str], messages: Sequence[Message]) -> str:
    """The text of a chat whose last message is still being said: the template (``render``)
    up to that message's :func:`settled_words`, the turn left open; a prefix of ``render`` of
    any chat whose last message starts with this one's words."""
    text = words_open_text(render, messages)
    content = messages[-1]["content"]
    return text[: len(text) - (len(content) - len(settled_words(content)))]


def words_open_text(render: Callable[[Sequence[Message]], str], messages: Sequence[Message]) -> str:
    """The template's text (``render``) up to the end of the last message's words, its turn
    still open."""
    if not messages:
        raise LlmError("no message to leave open")
    *before, last = messages
    text = render([*before, {**last, "content": last["content"] + OPEN_MARK}])
    end = text.find(OPEN_MARK)
    if end < 0 or text.count(OPEN_MARK) != 1:
        raise LlmError("the chat template does not keep a message's words in place")
    return text[:end]


class ChatPrompts:
    """Chat messages as prompt token ids, by a model's tokenizer and chat template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer

    def _template(self, messages: Sequence[Message]) -> str:
        text = self._tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )
        if not isinstance(text, str):
            raise LlmError("the chat template did not render to text")
        return text

    def _ids(self, text: str) -> list[int]:
        return [int(i) for i in self._tokenizer(text, add_special_tokens=False)["input_ids"]]

    def render(self, messages: Sequence[Message]) -> list[int]:
        """Prompt token ids: the chat template with the assistant turn opened."""
        return self._ids(self._template(messages))

    def render_open(self, messages: Sequence[Message]) -> list[int]:
        """Prompt token ids of a chat whose last message is still being said: the template up
        to that message's :func:`settled_words`, the turn left open.

        They are a prefix of :meth:`render`'s ids of any chat whose last message starts with
        this one's words: the cut lies where a space (or the first word) begins, and byte-level
        BPE's split (GPT-2's) never merges across it. Kept to the ids :meth:`render` of
        ``messages`` shares, in case a template rewrites the words.
        """
        ids = self._ids(open_text(self._template, messages))
        return ids[: _common_prefix(ids, self.render(messages))]


def _elapsed_ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0


def check_salt(salt: str | None) -> None:
    """LlmError unless vLLM takes ``salt`` as a cache_salt (None: no salt, always fine)."""
    if salt is not None and (
        not salt or len(salt) > SALT_MAX_CHARS or not SALT_FORBIDDEN.isdisjoint(salt)
    ):
        raise LlmError(
            f"a cache_salt needs 1-{SALT_MAX_CHARS} characters and none of @ / \\ or NUL"
        )


# --------------------------------------------------------------------------- in-process vLLM


@dataclass(frozen=True)
class VllmOptions:
    """In-process vLLM settings (CPU defaults: small KV cache, eager mode, 32-token blocks)."""

    max_model_len: int = 2048  # tokens, prompt and reply together
    enforce_eager: bool = True  # no graph compilation (start in ~30 s on CPU)
    enable_prefix_caching: bool = True
    # tokens per KV block, the prefix cache's unit; vLLM 0.32's CPU attention takes only
    # multiples of 32 (16 fails at start: "No common block size for 16")
    block_size: int = 32
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE when unset
    dtype: Dtype = "bfloat16"
    temperature: float = 0.0  # 0 = greedy
    max_num_seqs: int = 16  # concurrent requests in one batch
    seed: int = 0
    omp_bind: str = ""  # cores of the OpenMP threads ("1", "2,3"); "" = vLLM's own choice


class VllmEngine:
    """vLLM's AsyncLLM in this process (the engine core runs in a spawned child process).

    Constructing it loads the model and blocks for ~20-40 s; in async code use :meth:`start`.
    Entry points that start it need an ``if __name__ == "__main__":`` guard (spawn).
    """

    def __init__(self, model_dir: Path, options: VllmOptions | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.options = options or VllmOptions()
        self._stats = _StatsBook()
        self._closed = False
        if not (self.model_dir / "config.json").is_file():
            raise LlmError(f"no model at {self.model_dir} (run python -m models.prepare)")
        _default_env(self.options)
        started = time.perf_counter()
        log.info("loading LLM from %s", self.model_dir)
        try:
            from transformers import AutoTokenizer
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
            from vllm.v1.engine.async_llm import AsyncLLM

            self.prompts = ChatPrompts(AutoTokenizer.from_pretrained(str(self.model_dir)))
            dtype = self.options.dtype
            if current_platform.is_cpu():
                dtype = cpu_dtype(dtype)
            args = AsyncEngineArgs(
                model=str(self.model_dir),
                dtype=dtype,
                max_model_len=self.options.max_model_len,
                enforce_eager=self.options.enforce_eager,
                enable_prefix_caching=self.options.enable_prefix_caching,
                block_size=self.options.block_size,
                max_num_seqs=self.options.max_num_seqs,
                seed=self.options.seed,
                disable_log_stats=True,
            )
            self._engine: AsyncLLM = AsyncLLM.from_engine_args(args)
        except Exception as e:
            raise LlmError(f"could not start vLLM on {self.model_dir}: {e}") from e
        log.info("LLM ready in %.1f s", time.perf_counter() - started)

    @classmethod
    async def start(cls, model_dir: Path, options: VllmOptions | None = None) -> VllmEngine:
        """Load the model without blocking the event loop (~20-40 s on CPU)."""
        return await asyncio.to_thread(cls, model_dir, options)

    def render(self, messages: Sequence[Message]) -> list[int]:
        """Prompt token ids: the chat template with the assistant turn opened."""
        return self.prompts.render(messages)

    def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncGenerator[str, None]:
        """Greedy (by default) reply deltas; ``aclose()`` or cancelling the consumer aborts."""
        return self._generate(messages, request_id, max_tokens, cache_salt)

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> GenerationStats:
        """Submit exactly the tokens stream() would (assistant turn opened, nothing after it).

        Every whole KV block of that prompt stays in the prefix cache, so a later stream() of
        the same or an extended conversation, with the same ``cache_salt``, reuses it. One
        token is generated and dropped.
        """
        generation = self._generate(messages, request_id, 1, cache_salt)
        return await _one_token(generation, self._stats, request_id)

    async def prefill_open(
        self,
        messages: Sequence[Message],
        request_id: str,
        *,
        cache_salt: str | None = None,
        paused: bool = False,
    ) -> GenerationStats:
        """Warm the prefix cache while the last message is still being said: the prompt of
        :meth:`ChatPrompts.render_open`, a token prefix of the one stream() will send once the
        message is complete, so that reply reuses its whole blocks. One token is generated.
        ``paused`` changes nothing: vLLM reuses whole blocks, so the turn stays open."""
        generation = self._generate(messages, request_id, 1, cache_salt, open_turn=True)
        return await _one_token(generation, self._stats, request_id)

    async def _generate(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        cache_salt: str | None,
        open_turn: bool = False,
    ) -> AsyncGenerator[str, None]:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        if self._closed:
            raise LlmError("the engine is closed")
        check_salt(cache_salt)
        started = time.perf_counter()
        ids = self.prompts.render_open(messages) if open_turn else self.render(messages)
        room = self.options.max_model_len - len(ids)
        if room < 1:
            raise LlmError(
                f"prompt of {len(ids)} tokens leaves no room (max_model_len "
                f"{self.options.max_model_len})"
            )
        params = SamplingParams(
            output_kind=RequestOutputKind.DELTA,
            max_tokens=max(1, min(max_tokens, room)),
            temperature=self.options.temperature,
        )
        cached = 0
        produced = 0
        ttft: float | None = None
        finish: str | None = None
        tokens = TokensPrompt(prompt_token_ids=ids)
        if cache_salt is not None:  # vLLM hashes it into the first block, so into every block
            tokens["cache_salt"] = cache_salt
        try:
            (prompt,) = self._engine.renderer.render_cmpl([tokens])
        except Exception as e:
            raise LlmError(f"vLLM rejected the prompt of {request_id}: {e}") from e
        outputs = self._engine.generate(prompt, params, request_id)
        try:
            async for out in outputs:
                if out.num_cached_tokens:  # reported on the first delta only; later ones say 0
                    cached = max(cached, out.num_cached_tokens)
                if not out.outputs:
                    continue
                done = out.outputs[0]
                if done.token_ids:
                    produced += len(done.token_ids)
                    if ttft is None:
                        ttft = _elapsed_ms(started)
                if done.finish_reason is not None:
                    finish = done.finish_reason
                if done.text:
                    yield done.text
        except (GeneratorExit, asyncio.CancelledError):
            finish = finish or "abort"  # the consumer closed or cancelled the stream
            raise
        except Exception as e:
            raise LlmError(f"vLLM request {request_id} failed: {e}") from e
        finally:
            await outputs.aclose()  # aborts the request in vLLM if it is still running
            self._stats.put(request_id, GenerationStats(len(ids), cached, produced, ttft, finish))

    async def abort(self, request_id: str) -> None:
        if self._closed:
            return
        try:
            await self._engine.abort(request_id)
        except Exception as e:
            raise LlmError(f"aborting {request_id} failed: {e}") from e

    def last_stats(self, request_id: str) -> GenerationStats | None:
        return self._stats.get(request_id)

    def running(self) -> int:
        """Requests the engine has not finished (0 once every stream ended or was aborted)."""
        return 0 if self._closed else self._engine.get_num_unfinished_requests()

    async def close(self) -> None:
        """Stop the engine processes (~5 s); streams still running fail with LlmError."""
        if self._closed:
            return
        self._closed = True
        started = time.perf_counter()
        await asyncio.to_thread(self._engine.shutdown)
        del self._engine  # its __del__ shuts down again; let that happen now, not at exit
        log.info("LLM engine shut down in %.1f s", time.perf_counter() - started)


def cpu_dtype(requested: Dtype, cpu_flags: str | None = None) -> Dtype:
    """The dtype vLLM's CPU build runs: ``requested``, except bfloat16 on a CPU with AMX
    (``amx_bf16``: Intel Sapphire Rapids and later), where vLLM 0.32 computes wrong tokens
    (SmolLM2 answered "L'Étoile, la Marseillaise, ..." to "What is the capital of France?";
    in float32, "The capital of France is Paris."): float32 there."""
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    if requested == "bfloat16" and "amx_bf16" in flags.split():
        log.warning("this CPU has AMX, where vLLM's bfloat16 is wrong: running float32")
        return "float32"
    return requested


def _cpu_flags() -> str:
    """The ISA flags of the first CPU in /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return line.partition(":")[2]
    except OSError:
        pass
    return ""


def _default_env(options: VllmOptions) -> None:
    """vLLM settings read from the environment, only where the operator has not set them."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(options.kv_cache_gib))  # GiB
    os.environ.setdefault("VLLM_CACHE_ROOT", str(PROJECT_ROOT / ".cache" / "vllm"))
    if options.omp_bind:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", options.omp_bind)


# --------------------------------------------------------------------------- remote vLLM server


class LlmUnavailable(LlmError):
    """No replica of a remote LLM could start the request (each failed or timed out)."""


class LlmStreamError(LlmError):
    """A remote server's event stream failed: an error event, or it ended before [DONE]."""


@dataclass(frozen=True)
class RemoteOptions:
    """One or more vLLM OpenAI-compatible servers serving the same model. Times in seconds.

    ``first_token_timeout_s`` bounds a replica's time from the request to its first streamed
    token; until that token nothing has reached the caller, so a replica that is down, refuses,
    answers 5xx/429, or hangs is left for the next one. ``read_timeout_s`` is the longest
    silence between two chunks after that (then the request fails: its text is half-spoken).
    """

    base_url: str  # the first replica, e.g. "http://127.0.0.1:8000"
    model: str  # the served model name
    more_urls: tuple[str, ...] = ()  # further replicas of the same model
    api_key: str | None = field(default=None, repr=False)
    temperature: float = 0.0
    connect_timeout_s: float = 2.0
    first_token_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    total_timeout_s: float | None = None
    replica_down_s: float = 10.0  # a replica that failed is tried last for this long
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into each request

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.base_url, *self.more_urls)


@dataclass
class _RemoteCall:
    """A running request: what abort() needs to stop it in any phase."""

    response: aiohttp.ClientResponse | None = None
    opening: asyncio.Future[Any] | None = None  # the attempt waiting for its first token
    aborted: bool = False


@dataclass
class _Tally:
    """What a request's events reported so far (usage arrives last, with stream_options)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    deltas: int = 0
    usage_tokens: int | None = None
    finish: str | None = None

    def apply(self, event: dict[str, Any], url: str) -> str | None:
        """Take one stream event; its text delta, if any. An error event raises LlmError."""
        if "error" in event or event.get("object") == "error":
            reason = event.get("error") or event.get("message")
            raise LlmStreamError(f"{url} failed mid-stream: {reason}")
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            completion = usage.get("completion_tokens")
            self.usage_tokens = int(completion) if isinstance(completion, int) else None
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                self.cached_tokens = int(details.get("cached_tokens") or 0)
        choices = event.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
        text = (choice.get("delta") or {}).get("content")
        if not text:
            return None
        self.deltas += 1
        return str(text)


class _RetryOnAnother(Exception):
    """This replica could not start the request; the next one may (nothing was yielded)."""


@dataclass
class _Opened:
    """A replica's stream, read up to its first text delta (None: it ended without text)."""

    response: aiohttp.ClientResponse
    events: AsyncGenerator[dict[str, Any], None]
    first: str | None


RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))


class RemoteVllm:
    """Streams chat completions from remote vLLM servers over HTTP (Server-Sent Events).

    Same behaviour as :class:`VllmEngine`: ``prefill`` warms the prefix cache of the replica the
    reply will go to (see :mod:`models.replicas`); ``abort``, ``aclose()`` or cancelling the
    consumer close the HTTP stream, and vLLM aborts a request whose client has gone. A replica
    that fails before the first token is left for the next one; failures are :class:`LlmError`.
    vLLM reports ``cached_tokens`` only with ``--enable-prompt-tokens-details`` (and prefix
    caching on); otherwise they read 0. The request id goes out as ``X-Request-Id``, the
    ``cache_salt`` in the body (over ``extra_body``'s, if that names one).
    """

    def __init__(self, options: RemoteOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self._replicas = ReplicaSet(
            [u.rstrip("/") for u in options.urls], down_s=options.replica_down_s, clock=clock
        )
        self._session: aiohttp.ClientSession | None = None
        self._calls: dict[str, _RemoteCall] = {}
        self._stats = _StatsBook()

    def replica_status(self) -> list[ReplicaStatus]:
        """Each replica's requests in flight, served and failed attempts."""
        return self._replicas.status()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            opts = self.options
            headers = {"Accept": "text/event-stream"}
            if opts.api_key:
                headers["Authorization"] = f"Bearer {opts.api_key}"
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(
                    total=opts.total_timeout_s,
                    connect=opts.connect_timeout_s,
                    sock_connect=opts.connect_timeout_s,
                    sock_read=opts.read_timeout_s,
                ),
            )
        return self._session

    def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncGenerator[str, None]:
        """Reply deltas; ``aclose()`` or cancelling the consumer closes the HTTP stream."""
        return self._generate(messages, request_id, max_tokens, cache_salt)

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> GenerationStats:
        """The same request as stream() with max_tokens=1; the replica caches its prefix."""
        generation = self._generate(messages, request_id, 1, cache_salt)
        return await _one_token(generation, self._stats, request_id)

    async def _generate(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        cache_salt: str | None,
    ) -> AsyncGenerator[str, None]:
        if request_id in self._calls:
            raise LlmError(f"request {request_id} is already running")
        check_salt(cache_salt)
        body: dict[str, Any] = {
            "model": self.options.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": max_tokens,
            "temperature": self.options.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.options.extra_body,
        }
        if cache_salt is not None:
            body["cache_salt"] = cache_salt  # the caller's scope; the operator's may not widen it
        prompt, anchor = prompt_key(messages, cache_salt or "")
        call = _RemoteCall()
        self._calls[request_id] = call
        started = time.perf_counter()
        tally = _Tally()
        ttft: float | None = None
        opened: _Opened | None = None
        busy: Replica | None = None  # the replica counting this request in flight
        failures: list[str] = []
        try:
            for replica in self._replicas.order(prompt, anchor):
                if call.aborted:
                    break
                tally = _Tally()
                self._replicas.started(replica)
                busy = replica
                try:
                    opened = await self._open(replica.url, body, request_id, call, tally)
                except _RetryOnAnother as e:
                    self._replicas.ended(replica)
                    busy = None
                    self._replicas.failed(replica)
                    failures.append(str(e))
                    log.warning("LLM request %s: %s; trying the next replica", request_id, e)
                    continue
                if opened is not None:  # None: aborted while opening
                    self._replicas.served(replica, prompt)
                break
            if opened is None:
                if call.aborted:
                    return
                raise LlmUnavailable(
                    f"no replica answered request {request_id}: {'; '.join(failures)}"
                )
            url = str(opened.response.url)
            if opened.first is not None:  # else the stream ended without text
                ttft = _elapsed_ms(started)
                yield opened.first
                async for event in opened.events:
                    text = tally.apply(event, url)
                    if text:
                        yield text
        except (GeneratorExit, asyncio.CancelledError):
            call.aborted = True  # the consumer closed or cancelled the stream
            raise
        except LlmError:
            if not call.aborted:
                raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            if not call.aborted:
                raise LlmError(f"request {request_id} failed mid-stream: {e!r}") from e
        finally:
            self._calls.pop(request_id, None)
            if busy is not None:
                self._replicas.ended(busy)  # the whole reply counted in flight
            if opened is not None:  # vLLM aborts a request whose client has gone
                await _discard(opened.response, opened.events)
            finish = "abort" if call.aborted else tally.finish
            outputs = tally.usage_tokens if tally.usage_tokens is not None else tally.deltas
            stats = GenerationStats(tally.prompt_tokens, tally.cached_tokens, outputs, ttft, finish)
            self._stats.put(request_id, stats)

    async def _open(
        self, url: str, body: dict[str, Any], request_id: str, call: _RemoteCall, tally: _Tally
    ) -> _Opened | None:
        """Send the request to one replica and read up to its first text delta.

        Runs as its own task so that abort() can stop it while it waits (then returns None).
        Raises _RetryOnAnother for a failure another replica may not have, LlmError otherwise.
        """
        task = asyncio.ensure_future(self._first_token(url, body, request_id, call, tally))
        call.opening = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if call.aborted and (current is None or not current.cancelling()):
                return None  # abort() cancelled the attempt, not our consumer
            raise
        finally:
            call.opening = None

    async def _first_token(
        self, url: str, body: dict[str, Any], request_id: str, call: _RemoteCall, tally: _Tally
    ) -> _Opened:
        endpoint = f"{url}/v1/chat/completions"
        response: aiohttp.ClientResponse | None = None
        events: AsyncGenerator[dict[str, Any], None] | None = None
        try:
            async with asyncio.timeout(self.options.first_token_timeout_s):
                response = await self._client().post(
                    endpoint, json=body, headers={"X-Request-Id": request_id}
                )
                call.response = response
                if response.status != 200:
                    detail = (await response.text())[:300]
                    message = f"{endpoint} answered {response.status}: {detail}"
                    if response.status in RETRYABLE_STATUS:
                        raise _RetryOnAnother(message)
                    raise LlmError(message)
                events = _sse_events(response)
                async for event in events:
                    text = tally.apply(event, endpoint)
                    if text:
                        return _Opened(response, events, text)
                return _Opened(response, events, None)
        except BaseException as e:
            await _discard(response, events)
            reason = self._retry_reason(e, endpoint)
            if reason is None:
                raise
            raise _RetryOnAnother(reason) from e

    def _retry_reason(self, e: BaseException, endpoint: str) -> str | None:
        """Why another replica may answer where ``endpoint`` failed with ``e`` before its first
        text; None when it may not (an LlmError of the request itself, a cancellation)."""
        if isinstance(e, LlmStreamError):
            return f"{endpoint}: {e}"  # broke off before any text
        if isinstance(e, aiohttp.ClientError):  # refused, reset, or silent past read_timeout_s
            return f"{endpoint} failed: {type(e).__name__}: {e}"
        if isinstance(e, TimeoutError):  # asyncio.timeout: no token within first_token_timeout_s
            return f"{endpoint} gave no token within {self.options.first_token_timeout_s} s"
        if isinstance(e, (OSError, ValueError)):
            return f"{endpoint} failed: {type(e).__name__}: {e}"
        return None

    async def abort(self, request_id: str) -> None:
        call = self._calls.get(request_id)
        if call is None:
            return
        call.aborted = True
        if call.opening is not None:
            call.opening.cancel()
        if call.response is not None:
            call.response.close()

    def last_stats(self, request_id: str) -> GenerationStats | None:
        return self._stats.get(request_id)

    async def close(self) -> None:
        for request_id in list(self._calls):
            await self.abort(request_id)
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _discard(
    response: aiohttp.ClientResponse | None, events: AsyncGenerator[dict[str, Any], None] | None
) -> None:
    if response is not None:
        response.close()
    if events is not None:
        await events.aclose()


async def _sse_events(response: aiohttp.ClientResponse) -> AsyncGenerator[dict[str, Any], None]:
    """JSON payloads of the ``data:`` lines of a Server-Sent Events body, up to ``[DONE]``."""
    data: list[str] = []
    while True:
        raw = await response.content.readline()
        if not raw:
            raise LlmStreamError("the event stream ended before [DONE]")
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line or not data:
            continue  # comments, other fields; or a blank line with no data
        payload = "\n".join(data)
        data = []
        if payload == "[DONE]":
            return
        event = json.loads(payload)
        if isinstance(event, dict):
            yield event
