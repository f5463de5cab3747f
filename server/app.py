"""The aiohttp application: health and the demo page (signaling and peers land with transport)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from aiohttp import web

from server import __version__
from server.config import Config

log = logging.getLogger(__name__)

CONFIG_KEY = web.AppKey("config", Config)
STARTED_KEY = web.AppKey("started_monotonic", float)

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
        }
    )


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(web_root(request.app[CONFIG_KEY]) / "index.html")


def create_app(config: Config) -> web.Application:
    """Build the application for ``config``."""
    app = web.Application(client_max_size=1 << 20)
    app[CONFIG_KEY] = config
    app[STARTED_KEY] = time.monotonic()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", index)
    root = web_root(config)
    if root.is_dir():
        app.router.add_static("/static/", root, show_index=False)
    return app
