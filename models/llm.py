"""What every LLM engine shares: the :class:`LlmEngine` Protocol, its errors and stats, chat
prompts, and the tally of an OpenAI-style token stream.

A chat is a sequence of ``{"role": ..., "content": ...}`` dicts; a reply streams as text deltas
and leaves its :class:`GenerationStats` (tokens, ms). A request's ``cache_salt`` scopes the
engine's shared prefix cache: without salts, whether a prompt hits the cache tells one caller
what another one's prompt began with.

The engines: :mod:`models.llamacpp` (llama.cpp in process), :mod:`models.llm_vllm` (vLLM in
process) and :mod:`models.llm_remote` (vLLM servers over HTTP).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# {"role": "system" | "user" | "assistant" | "tool", "content": str}, and an assistant's
# "tool_calls" (OpenAI Chat-style) where it called tools
Message = dict[str, Any]

STATS_KEPT = 256  # finished requests whose stats last_stats() still answers
SALT_MAX_CHARS = 128  # vLLM's limit on a cache_salt
SALT_FORBIDDEN = frozenset("@/\\\x00")  # characters vLLM's server refuses in a cache_salt
OPEN_MARK = "\ue000"  # a private-use character: where an open message's words end
LAST_WORD = re.compile(r"\s*\S+\s*$")


class LlmError(Exception):
    """An LLM request or engine failed (bad prompt, engine dead, HTTP error, timeout)."""


class LlmStreamError(LlmError):
    """An engine's event stream failed: an error event, one of no known form, or an end before
    ``[DONE]``."""


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


class StatsBook:
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

    async def drain(
        self, generation: AsyncGenerator[str, None], request_id: str
    ) -> GenerationStats:
        """Run a max_tokens=1 generation (a prefix-cache warm-up) to its end; the stats it
        put here."""
        async for _ in generation:
            pass
        stats = self.get(request_id)
        if stats is None:  # pragma: no cover - every engine records as its stream ends
            raise LlmError(f"prefill {request_id} left no stats")
        return stats


@dataclass
class StreamTally:
    """What an OpenAI-style token stream reported so far: text deltas (a chat's
    ``delta.content`` or a completion's ``text``), then usage with the last event when
    ``stream_options.include_usage`` is on. Counts in tokens, ``ttft_ms`` set by the engine."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    usage_tokens: int | None = None  # the usage's completion_tokens, once it came
    deltas: int = 0  # text deltas: the output when no usage came (a stream cut short)
    ttft_ms: float | None = None
    finish: str | None = None

    def apply(self, event: Any, source: str) -> str | None:
        """Take one event; its text delta, if any. An error event, or one that is no JSON
        object, raises LlmStreamError naming ``source`` (the stream's URL or request)."""
        if not isinstance(event, dict):
            raise LlmStreamError(f"{source} sent an unexpected event {event!r:.200}")
        if (
            "error" in event
            or event.get("object") == "error"
            or {"code", "message"} <= event.keys()
        ):
            reason = event.get("error") or event.get("message")
            raise LlmStreamError(f"{source} sent an error: {reason}")
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
        text = (choice.get("delta") or {}).get("content") or choice.get("text")
        if not text:
            return None
        self.deltas += 1
        return str(text)

    def stats(self) -> GenerationStats:
        outputs = self.usage_tokens if self.usage_tokens is not None else self.deltas
        return GenerationStats(
            self.prompt_tokens, self.cached_tokens, outputs, self.ttft_ms, self.finish
        )


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


def elapsed_ms(since: float) -> float:
    """Milliseconds since ``since`` (a time.perf_counter() reading)."""
    return (time.perf_counter() - since) * 1000.0


def check_salt(salt: str | None) -> None:
    """LlmError unless vLLM takes ``salt`` as a cache_salt (None: no salt, always fine)."""
    if salt is not None and (
        not salt or len(salt) > SALT_MAX_CHARS or not SALT_FORBIDDEN.isdisjoint(salt)
    ):
        raise LlmError(
            f"a cache_salt needs 1-{SALT_MAX_CHARS} characters and none of @ / \\ or NUL"
        )
