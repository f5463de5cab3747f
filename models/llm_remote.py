"""vLLM servers over HTTP (:class:`RemoteVllm`): chat completions streamed as Server-Sent
Events, a request sent to the replica that holds its prefix and, before its first token, failed
over to the next. Timeouts in seconds, stats in tokens and ms."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from models.llm import (
    GenerationStats,
    LlmError,
    LlmStreamError,
    Message,
    StatsBook,
    StreamTally,
    check_salt,
    elapsed_ms,
)
from models.replicas import Replica, ReplicaSet, ReplicaStatus, prompt_key

log = logging.getLogger(__name__)


class LlmUnavailable(LlmError):
    """No replica of a remote LLM could start the request (each failed or timed out)."""


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

    Same behaviour as :class:`models.llm_vllm.VllmEngine`: ``prefill`` warms the prefix cache
    of the replica the reply will go to (see :mod:`models.replicas`); ``abort``, ``aclose()`` or
    cancelling the consumer close the HTTP stream, and vLLM aborts a request whose client has
    gone. A replica that fails before the first token is left for the next one; failures are
    :class:`LlmError`.
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
        self._stats = StatsBook()

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
        return await self._stats.drain(generation, request_id)

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
        tally = StreamTally()
        opened: _Opened | None = None
        busy: Replica | None = None  # the replica counting this request in flight
        failures: list[str] = []
        try:
            for replica in self._replicas.order(prompt, anchor):
                if call.aborted:
                    break
                tally = StreamTally()
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
                tally.ttft_ms = elapsed_ms(started)
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
            if call.aborted:
                tally.finish = "abort"
            self._stats.put(request_id, tally.stats())

    async def _open(
        self, url: str, body: dict[str, Any], request_id: str, call: _RemoteCall, tally: StreamTally
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
        self, url: str, body: dict[str, Any], request_id: str, call: _RemoteCall, tally: StreamTally
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
