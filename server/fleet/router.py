"""The public HTTP front of several workers (server/fleet/workers.py).

Requests go where sessions live.

- ``POST /offer``, ``POST /whip`` and ``POST /v1/realtime/calls`` go to the least-loaded
  ready worker. A worker that answers
  503 (full) is skipped; when every worker is full the last 503 (JSON, ``Retry-After``) is
  returned. The per-address session rate limit (429) is kept here for the machine (each
  worker keeps it too, as a second line).
- ``/whip/<id>`` and ``/v1/realtime/calls/<id>`` (DELETE, PATCH, ``hangup``, OPTIONS, ...) go to
  the worker named by the id's ``wk-``
  prefix; an id that names no running worker is 404 (a worker that died took its sessions along).
- While the supervisor drains (its first SIGTERM with ``server.drain_timeout_s``), new sessions
  get 503 "draining" (``Retry-After``) and ``/healthz`` says ``draining`` with 503; requests
  for live sessions still reach their workers until the last one has ended.
- ``GET /healthz`` and ``GET /metrics`` cover every worker (metrics labelled ``worker="k"``, plus
  ``avatar_worker_up`` and ``avatar_worker_restarts_total``); ``GET /debug/sessions`` joins the
  workers' lists.
- Anything else (``/``, ``/static/``, ``OPTIONS /whip``, ...) goes to a ready worker.

Requests pass the checks of server/http/guards.py first (no dot segments, an allowed ``Host``).
They and their responses pass through unchanged except hop-by-hop headers (and a request's
``Content-Encoding``: its body goes on as aiohttp decoded it); the path goes on exactly as it
was routed, and every request carries the workers' key. The client's ``Host`` is kept, so
a worker builds its URLs for the public address, and an absolute ``Location`` naming a worker is
rewritten to the router. The router's own errors are JSON like server/http/signaling.py. The
workers' metrics and lists are joined by server/fleet/merge.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from server import __version__
from server.config import Config
from server.conversation.resume import split_token
from server.errors import Draining, NotFound, RequestError, ServerFull
from server.fleet.merge import join_objects, merge_expositions, pool_metrics
from server.fleet.pool import Pool, Upstream
from server.http.guards import WORKER_KEY_HEADER, request_guards
from server.http.middleware import json_errors
from server.http.realtime_calls import CALLS_PATH
from server.http.signaling import (
    PROXIES_KEY,
    RESUME_HEADER,
    add_session_limit,
    client_address,
    limit_session_rate,
    read_limited,
    resume_token,
)
from server.jsontext import JsonRefused, load_json

log = logging.getLogger(__name__)

PROXY_TIMEOUT_S = 30.0  # a worker's answer to one signaling request
SCRAPE_TIMEOUT_S = 2.0  # a worker's /metrics or /debug/sessions
HEALTHZ_WAIT_S = 0.5  # /healthz waits this long for fresh figures, then answers with the last
WORKER_ID = re.compile(r"w(\d+)-")  # the prefix of a worker's session ids
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
DROP_FROM_RESPONSE = HOP_BY_HOP | {"date", "server"}  # the router's own are sent
# the body read from the client is already decoded (gzip, deflate, ...): sent on as it is
DROP_FROM_REQUEST = HOP_BY_HOP | {"content-encoding"}
URL_HEADERS = ("Location", "Content-Location")


class WorkerUnavailable(RequestError):
    """No worker could answer (it refused the connection, failed or timed out)."""

    status = 502
    code = "worker_unavailable"


@dataclass(frozen=True)
class Answer:
    """A worker's answer, to be passed on."""

    status: int
    reason: str | None
    headers: CIMultiDict[str]
    body: bytes

    def response(self) -> web.Response:
        return web.Response(
            status=self.status, reason=self.reason, body=self.body, headers=self.headers
        )


def resume_token_of(request: web.Request, body: bytes) -> str | None:
    """The resume token of an ``/offer`` or ``/whip`` as the worker will read it
    (server/http/signaling.py ``resume_token``: the header, else the ``/offer`` body's
    field); None when it has none, or a body the worker will refuse anyway."""
    field = None
    if request.path == "/offer" and RESUME_HEADER not in request.headers:
        try:
            data = load_json(body.decode("utf-8"))
        except (UnicodeDecodeError, JsonRefused):
            return None
        field = data.get("resume_token") if isinstance(data, dict) else None
    return resume_token(request, field)


def worker_of(session_id: str, prefix: str = "") -> int | None:
    """The worker index in a session id that starts with the host's ``prefix`` (``h1.``):
    ``h1.w2-...`` -> 2; None for any other id."""
    if not session_id.startswith(prefix):
        return None
    match = WORKER_ID.match(session_id, len(prefix))
    return int(match.group(1)) if match else None


class Router:
    """Routes HTTP requests to the pool's workers."""

    def __init__(self, config: Config, pool: Pool, worker_key: str = "") -> None:
        self.config = config
        self.pool = pool
        self._key = {WORKER_KEY_HEADER: worker_key} if worker_key else {}
        self.started = time.monotonic()
        self._http: aiohttp.ClientSession | None = None
        self._turn = 0  # rotates ties between equally loaded workers
        self._pending: dict[int, int] = {}  # offers on their way to a worker, by index

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        # no keep-alive: a restarted worker never meets a connection of its predecessor
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True), auto_decompress=False
        )
        yield
        await self._http.close()

    # ----- helpers

    async def _body(self, request: web.Request) -> bytes:
        return await read_limited(request, self.config.transport.max_body_bytes)

    def _by_load(self) -> list[Upstream]:
        """Ready workers, least-loaded first (offers in flight count; ties rotate)."""
        ready = [w for w in self.pool.workers if w.accepting]
        n = max(1, len(self.pool.workers))
        turn = self._turn
        self._turn += 1
        return sorted(
            ready,
            key=lambda w: (w.sessions + self._pending.get(w.index, 0), (w.index - turn) % n),
        )

    async def _forward(self, request: web.Request, worker: Upstream, body: bytes) -> Answer:
        """Send ``request`` (with ``body``) to ``worker``; its answer as the router's answer."""
        assert self._http is not None
        headers: CIMultiDict[str] = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in DROP_FROM_REQUEST
        )
        headers.pop(WORKER_KEY_HEADER, None)
        headers.update(self._key)
        headers["Host"] = request.host
        # the client as the router sees it, alone: the workers trust only the router
        headers["X-Forwarded-For"] = client_address(request)
        if not request.app[PROXIES_KEY].trusts(request.remote or ""):  # else theirs pass on
            headers["X-Forwarded-Proto"] = request.scheme
            headers["X-Forwarded-Host"] = request.host
        send_body = bool(body) or request.method not in ("GET", "HEAD", "OPTIONS", "DELETE")
        try:
            async with self._http.request(
                request.method,
                # the path exactly as routed here: nothing normalised on the way
                URL(f"{worker.url}{request.raw_path}", encoded=True),
                headers=headers,
                data=body if send_body else None,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=PROXY_TIMEOUT_S),
            ) as resp:
                payload = await resp.read()
                out: CIMultiDict[str] = CIMultiDict(
                    (k, v) for k, v in resp.headers.items() if k.lower() not in DROP_FROM_RESPONSE
                )
                status, reason = resp.status, resp.reason
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "worker %d: %s %s failed: %r", worker.index, request.method, request.path, exc
            )
            raise WorkerUnavailable(f"worker {worker.index} did not answer") from exc
        public = f"{request.scheme}://{request.host}"
        for name in URL_HEADERS:
            if name in out and out[name].startswith(worker.url):
                out[name] = public + out[name][len(worker.url) :]
        return Answer(status, reason, out, payload)

    async def _fresh(self) -> None:
        """Refresh the workers' figures, waiting at most HEALTHZ_WAIT_S: a hung worker must
        not hang /healthz (the pool's poll goes on and its figures serve the next call)."""
        with contextlib.suppress(TimeoutError):  # not wait_for: 3.11's can swallow a cancel
            async with asyncio.timeout(HEALTHZ_WAIT_S):
                await self.pool.poll()

    async def _scrape(
        self, worker: Upstream, path: str, request: web.Request
    ) -> tuple[int, bytes] | None:
        """GET ``path`` of a worker (with the caller's credentials): (status, body), or None if
        it does not answer."""
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        headers.update(self._key)
        try:
            timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
            url = f"{worker.url}{path}"
            async with self._http.get(url, headers=headers, timeout=timeout) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            return None

    # ----- handlers

    def _owner(self, session_id: str) -> Upstream:
        """The running worker that holds ``session_id``; NotFound when none does."""
        index = worker_of(session_id, self.config.server.session_id_prefix)
        owner = next((w for w in self.pool.workers if w.index == index), None)
        if owner is None or not owner.alive:
            raise NotFound("no such session")
        return owner

    async def place(self, request: web.Request) -> web.Response:
        """A new session (``POST /offer``, ``/whip``, ``/v1/realtime/calls``) on the
        least-loaded worker with room; a resume (``/offer``, ``/whip``) on the worker that
        holds its conversation."""
        resumes = request.path != CALLS_PATH  # the OpenAI calls have no resume
        if self.pool.draining and not (resumes and RESUME_HEADER in request.headers):
            raise Draining(self.config.transport.retry_after_s)
        limit_session_rate(request)
        body = await self._body(request)
        token = resume_token_of(request, body) if resumes else None
        if token is not None:
            owner = self._owner(split_token(token)[0])
            return (await self._forward(request, owner, body)).response()
        if self.pool.draining:  # a resume in the body of an /offer got past the first check
            raise Draining(self.config.transport.retry_after_s)
        candidates = self._by_load()
        if not candidates:
            raise ServerFull("no worker is ready", self.config.transport.retry_after_s)
        full: Answer | None = None
        for worker in candidates:
            self._pending[worker.index] = self._pending.get(worker.index, 0) + 1
            try:
                answer = await self._forward(request, worker, body)
            except WorkerUnavailable:
                continue
            finally:
                self._pending[worker.index] -= 1
            if answer.status == 503:
                full = answer  # at its session limit: try the next one
                continue
            if answer.status < 300:
                worker.placed()
            return answer.response()
        if full is not None:
            return full.response()
        raise WorkerUnavailable("no worker answered")

    async def to_owner(self, request: web.Request) -> web.Response:
        """A request for one session (``/whip/<id>``, ``/v1/realtime/calls/<id>``) to the
        worker that holds it."""
        owner = self._owner(request.match_info["session_id"])
        return (await self._forward(request, owner, await self._body(request))).response()

    async def to_any(self, request: web.Request) -> web.Response:
        """Anything else (the page, static files, preflights) to a ready worker."""
        candidates = self._by_load() or [w for w in self.pool.workers if w.alive]
        if not candidates:
            raise ServerFull("no worker is ready", self.config.transport.retry_after_s)
        return (await self._forward(request, candidates[0], await self._body(request))).response()

    async def healthz(self, request: web.Request) -> web.Response:
        """200 while at least one worker takes sessions (status ``ok`` or ``degraded``) and
        the machine does not drain."""
        await self._fresh()
        workers = list(self.pool.workers)
        ready = sum(w.accepting for w in workers)
        described = [w.describe() for w in workers]
        status = "ok" if ready == len(workers) else "degraded" if ready else "unavailable"
        draining = self.pool.draining
        return web.json_response(
            {
                "status": "draining" if draining else status,
                "draining": draining,
                "version": __version__,
                "uptime_s": round(time.monotonic() - self.started, 3),
                "sessions": sum(w.sessions for w in workers),
                "tasks": sum(int(d.get("tasks", 0)) for d in described),
                "workers": described,
            },
            status=200 if ready and not draining else 503,
        )

    async def metrics(self, request: web.Request) -> web.Response:
        """Every worker's metrics labelled ``worker="k"``, and the supervisor's own."""
        workers = [w for w in self.pool.workers if w.accepting]  # a hung one would only delay
        scraped = await asyncio.gather(*(self._scrape(w, "/metrics", request) for w in workers))
        parts = [
            (str(w.index), got[1].decode())
            for w, got in zip(workers, scraped, strict=True)
            if got is not None and got[0] == 200
        ]
        body = merge_expositions(parts) + pool_metrics(self.pool.workers)
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    async def debug_sessions(self, request: web.Request) -> web.Response:
        """The workers' ``/debug/sessions`` joined; a worker's refusal (401, 404) as it is."""
        workers = [w for w in self.pool.workers if w.accepting]
        body = await self._body(request)
        answers = await asyncio.gather(
            *(self._forward(request, w, body) for w in workers), return_exceptions=True
        )
        replies = [a for a in answers if isinstance(a, Answer)]
        joined = [json.loads(a.body) for a in replies if a.status == 200]
        if joined:
            return web.json_response(join_objects(joined))
        if replies:
            return replies[0].response()
        raise WorkerUnavailable("no worker answered")


def create_router(config: Config, pool: Pool, worker_key: str = "") -> web.Application:
    """The public application of a supervisor; ``worker_key`` goes with every request to a
    worker (server/http/guards.py)."""
    router = Router(config, pool, worker_key)
    app = web.Application(middlewares=[*request_guards(config), json_errors])
    # the session rate limit per client address is kept here, for the whole machine (each
    # worker keeps the same limit on the addresses the router forwards, as a second line)
    add_session_limit(app, config)
    app.cleanup_ctx.append(router.lifecycle)
    app.router.add_get("/healthz", router.healthz)
    app.router.add_get("/metrics", router.metrics)
    app.router.add_get("/debug/sessions", router.debug_sessions)
    app.router.add_post("/offer", router.place)
    app.router.add_post("/whip", router.place)
    app.router.add_route("*", "/whip/{session_id}", router.to_owner)
    app.router.add_route("*", "/whip/{session_id}/{tail:.*}", router.to_owner)
    app.router.add_post(CALLS_PATH, router.place)
    app.router.add_route("*", CALLS_PATH + "/{session_id}", router.to_owner)
    app.router.add_route("*", CALLS_PATH + "/{session_id}/{tail:.*}", router.to_owner)
    app.router.add_route("*", "/{tail:.*}", router.to_any)
    return app
