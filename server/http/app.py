"""The aiohttp application: signaling, health, metrics, the demo page; ordered shutdown."""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from server import __version__
from server.avatar.seam import AvatarRenderer
from server.clock import MonotonicClock
from server.config import Config
from server.errors import NotFound
from server.http.agent import serve_agent
from server.http.guards import request_guards
from server.http.middleware import cors_headers, json_errors
from server.http.realtime_calls import add_call_routes
from server.http.realtime_secrets import add_secret_routes
from server.http.realtime_ws import add_realtime_socket
from server.http.registry import SessionRegistry
from server.http.signaling import REGISTRY_KEY, add_routes, authenticate
from server.looplag import LoopLagMonitor
from server.metrics import Metrics
from server.osthreads import ThreadNamer, keep_naming
from server.pipeline.calibration import Calibration
from server.pipeline.seams import QueueObservable, ReportsFallbacks, TurnPipeline
from server.pipeline.turn_detector import TurnDetector
from server.priority import lowest_priority
from server.procstats import open_fds, rss_bytes
from server.rtc.audio_level import faster_audio_level
from server.rtc.settings import pin_host_addresses, widen_dtls_ciphers
from server.vision.sampling import VisionModel

log = logging.getLogger(__name__)

CONFIG_KEY = web.AppKey("config", Config)
STARTED_KEY = web.AppKey("started_monotonic", float)
METRICS_KEY = web.AppKey("metrics", Metrics)
STATIC_ROOT_KEY = web.AppKey("static_root", Path)  # the demo page folder, resolved
# what the start-up calibration measured and predicted (None: no reply pipeline)
CALIBRATION_KEY: web.AppKey[dict[str, object] | None] = web.AppKey("calibration")

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def web_root(config: Config) -> Path:
    """The demo page folder (relative paths are taken from the project root)."""
    path = Path(config.server.web_dir)
    return path if path.is_absolute() else PROJECT_ROOT / path


async def healthz(request: web.Request) -> web.Response:
    """Liveness: 200 with a small JSON body once the server accepts requests; 503 with status
    "draining" while it drains (its live sessions finish; a proxy sends new ones elsewhere)."""
    started = request.app[STARTED_KEY]
    draining = request.app[REGISTRY_KEY].draining
    return web.json_response(
        {
            "status": "draining" if draining else "ok",
            "draining": draining,
            "version": __version__,
            "uptime_s": round(time.monotonic() - started, 3),
            "sessions": request.app[REGISTRY_KEY].live,  # what counts against max_sessions
            "detached_sessions": request.app[REGISTRY_KEY].detached,  # waiting for a resume
            "tasks": len(asyncio.all_tasks()),
            "rss_bytes": rss_bytes(),
            "open_fds": open_fds(),
            "max_sessions": request.app[CONFIG_KEY].transport.max_sessions,
            "calibration": request.app[CALIBRATION_KEY],
        },
        status=503 if draining else 200,
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def debug_sessions(request: web.Request) -> web.Response:
    """Figures of live and recently closed sessions (only with server.debug_endpoints;
    transcripts inside, so it needs the bearer token when tokens are configured, and a token
    sees only the sessions it created). ``?collect=1``: with ``peer_objects``, counted after
    a full garbage collection, which holds the loop (calls then stutter on a slow CPU)."""
    caller = authenticate(request)
    registry = request.app[REGISTRY_KEY]
    collect = request.query.get("collect") == "1"
    return web.json_response(
        {
            "live": [
                registry.describe(session_id)
                for session_id, conversation in registry.conversations.items()
                if hmac.compare_digest(conversation.owner, caller)
            ],
            "closed": [
                described
                for owner, described in registry.finished
                if hmac.compare_digest(owner, caller)
            ],
            # after a full collection (?collect=1 only: it holds the loop, calls stutter)
            "peer_objects": registry.live_peer_objects() if collect else None,
            "closed_total": registry.closed_total,
            "reaped_total": registry.reaped_total,
            "tasks": task_census(),  # what the loop runs: a leaked task names itself here
        }
    )


def task_census() -> dict[str, int]:
    """How many asyncio tasks run each coroutine (by qualified name), most common first."""
    names = Counter(
        getattr(task.get_coro(), "__qualname__", type(task.get_coro()).__name__)
        for task in asyncio.all_tasks()
    )
    return dict(names.most_common())


async def static_file(request: web.Request) -> web.FileResponse:
    """A file of the demo page folder; a missing one is a JSON 404 like every other error."""
    root = request.app[STATIC_ROOT_KEY]
    path = (root / request.match_info["filename"]).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise NotFound("no such file")
    return web.FileResponse(path)


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(web_root(request.app[CONFIG_KEY]) / "index.html")


WARM_PAUSE_S = 0.1  # how often a warm-up held for live sessions looks again (s)


def warm_avatar(
    renderer: AvatarRenderer,
    stop: threading.Event,
    busy: Callable[[], bool] = lambda: False,
    pause_s: float = WARM_PAUSE_S,
) -> None:
    """Draw every look's sprites in the background, at the lowest CPU priority, so that the
    warm-up yields to live sessions (a frame that needs a sprite not yet drawn draws it).
    While ``busy()`` (sessions are live) it waits between sprites: drawing holds the GIL,
    which no priority gives back to the event loop."""
    started = time.monotonic()
    niced = lowest_priority()
    paused = 0.0

    def pace() -> None:
        nonlocal paused
        since = time.monotonic()
        while busy() and not stop.is_set():
            stop.wait(pause_s)
        paused += time.monotonic() - since

    for name in renderer.appearances:
        renderer.warm(name, stop, pace)
        if stop.is_set():
            return
    log.info(
        "avatar warmed up in %.1f s (%s; %.1f s of it waiting for sessions to end)",
        time.monotonic() - started,
        "lowest priority" if niced else "normal priority",
        paused,
    )


def create_app(
    config: Config,
    detector_factory: Callable[[], TurnDetector],
    pipeline: TurnPipeline | None = None,
    renderer: AvatarRenderer | None = None,
    vision: VisionModel | None = None,
    calibration: Calibration | None = None,
) -> web.Application:
    """Build the application. ``detector_factory`` makes one turn detector per session;
    ``pipeline`` answers the user (None: listen only); ``renderer`` draws the avatar (None:
    no video track); ``vision`` looks at the client's camera (None: camera ignored)."""
    app = web.Application(
        middlewares=[*request_guards(config), cors_headers, json_errors],
        client_max_size=config.transport.max_body_bytes,
    )
    app[CONFIG_KEY] = config
    app[STARTED_KEY] = time.monotonic()
    app[CALIBRATION_KEY] = None if calibration is None else calibration.to_dict()
    app[METRICS_KEY] = Metrics()
    app[REGISTRY_KEY] = SessionRegistry(
        config, detector_factory, pipeline, app[METRICS_KEY], renderer, vision
    )
    if isinstance(pipeline, QueueObservable):
        pipeline.set_queue_observer(app[METRICS_KEY].observe_engine_job)
    if isinstance(pipeline, ReportsFallbacks):
        fallbacks = app[METRICS_KEY].asr_fallbacks
        pipeline.set_fallback_observer(lambda name: fallbacks.labels(name).inc())
    pin_host_addresses(config.transport.ice_host_addresses)
    widen_dtls_ciphers()  # RSA-certificate peers (GStreamer, many WHIP publishers) too
    faster_audio_level()  # each outbound audio packet's level from numpy, not a Python loop

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        log.info("accepting sessions (max %d)", config.transport.max_sessions)
        app[REGISTRY_KEY].start_reaper()
        lag = app[METRICS_KEY].loop_lag
        monitor = LoopLagMonitor(lambda ms: lag.observe(ms / 1000), MonotonicClock())
        lag_task = asyncio.get_running_loop().create_task(monitor.run(), name="loop-lag")
        naming = asyncio.get_running_loop().create_task(
            keep_naming(ThreadNamer()), name="thread-names"
        )
        stop_warming = threading.Event()
        # a thread of its own: its lowered priority must not stay with a shared pool's thread
        warm_pool: ThreadPoolExecutor | None = None
        warming: asyncio.Future[None] | None = None
        if renderer is not None:
            log.info(
                "warming the avatar's sprites in the background (%s), yielding to sessions",
                ", ".join(renderer.appearances),
            )
            warm_pool = ThreadPoolExecutor(1, thread_name_prefix="avatar-warm")
            registry = app[REGISTRY_KEY]
            warming = asyncio.get_running_loop().run_in_executor(
                warm_pool, warm_avatar, renderer, stop_warming, lambda: registry.live > 0
            )
        agent = None
        if config.server.agent_port:
            registry = app[REGISTRY_KEY]
            agent = await serve_agent(
                config.server.host,
                config.server.agent_port,
                lambda: (registry.live, config.transport.max_sessions, registry.draining),
            )
        yield
        if agent is not None:
            agent.close()
            await agent.wait_closed()
        lag_task.cancel()
        naming.cancel()
        await asyncio.gather(lag_task, naming, return_exceptions=True)
        stop_warming.set()
        if warm_pool is not None and warming is not None:
            await warming
            warm_pool.shutdown()
        # shutdown, in order: peers first (they use the engines), then the engines
        await app[REGISTRY_KEY].close_all()
        if pipeline is not None:
            await pipeline.close()
        log.info("all sessions closed")

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", index)
    if config.server.debug_endpoints:
        app.router.add_get("/debug/sessions", debug_sessions)
    add_routes(app, config)
    add_call_routes(app)
    add_realtime_socket(app)
    minted = app[METRICS_KEY].client_secrets
    add_secret_routes(app, config, lambda event: minted.labels(event).inc())
    if web_root(config).is_dir():
        app[STATIC_ROOT_KEY] = web_root(config).resolve()  # once, not per request
        app.router.add_get("/static/{filename:.+}", static_file)
    return app
