"""The aiohttp application: signaling, health, metrics, the demo page; ordered shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from server import __version__
from server.config import Config
from server.metrics import Metrics
from server.pipeline import QueueObservable, TurnPipeline
from server.registry import SessionRegistry
from server.rtc import pin_host_addresses
from server.signaling import MAX_BODY_KEY, REGISTRY_KEY, add_routes, json_errors
from server.vad import TurnDetector

log = logging.getLogger(__name__)

CONFIG_KEY = web.AppKey("config", Config)
STARTED_KEY = web.AppKey("started_monotonic", float)
METRICS_KEY = web.AppKey("metrics", Metrics)

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def web_root(config: Config) -> Path:
    """The demo page folder (relative paths are taken from the project root)."""
    path = Path(config.server.web_dir)
    return path if path.is_absolute() else PROJECT_ROOT / path


async def healthz(request: web.Request) -> web.Response:
    """Liveness: 200 with a small JSON body once the server accepts requests."""
    started = request.app[STARTED_KEY]
    return web.json_response(
        {
            "status": "ok",
            "version": __version__,
            "uptime_s": round(time.monotonic() - started, 3),
            "sessions": len(request.app[REGISTRY_KEY]),
            "tasks": len(asyncio.all_tasks()),
        }
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def debug_sessions(request: web.Request) -> web.Response:
    """Figures of live and recently closed sessions (only with server.debug_endpoints)."""
    registry = request.app[REGISTRY_KEY]
    return web.json_response(
        {
            "live": [peer.describe() for peer in registry.sessions.values()],
            "closed": list(registry.finished),
        }
    )


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(web_root(request.app[CONFIG_KEY]) / "index.html")


def create_app(
    config: Config,
    detector_factory: Callable[[], TurnDetector],
    pipeline: TurnPipeline | None = None,
) -> web.Application:
    """Build the application. ``detector_factory`` makes one turn detector per session;
    ``pipeline`` answers the user (None: listen only)."""
    app = web.Application(
        middlewares=[json_errors], client_max_size=config.transport.max_body_bytes
    )
    app[CONFIG_KEY] = config
    app[STARTED_KEY] = time.monotonic()
    app[METRICS_KEY] = Metrics()
    app[MAX_BODY_KEY] = config.transport.max_body_bytes
    app[REGISTRY_KEY] = SessionRegistry(config, detector_factory, pipeline, app[METRICS_KEY])
    if isinstance(pipeline, QueueObservable):
        wait = app[METRICS_KEY].queue_wait
        pipeline.set_queue_observer(lambda engine, ms: wait.labels(engine).observe(ms / 1000))
    pin_host_addresses(config.transport.ice_host_addresses)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        log.info("accepting sessions (max %d)", config.transport.max_sessions)
        yield
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
    add_routes(app)
    root = web_root(config)
    if root.is_dir():
        app.router.add_static("/static/", root, show_index=False)
    return app
