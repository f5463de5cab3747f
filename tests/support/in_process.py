"""The real aiohttp app served in the test's own process (no reply pipeline, no video), for
tests that reach into its state (registry, rate limiter) while they call it over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.test_utils import TestServer

from server.config import Config, load_config
from server.http.app import create_app
from server.http.ratelimit import RateLimiter
from server.http.signaling import LIMITER_KEY
from server.pipeline.seams import TurnPipeline
from server.pipeline.wiring import detector_factory


@asynccontextmanager
async def running(
    settings: dict[str, str] | None = None,
    limiter: RateLimiter | None = None,
    pipeline: Callable[[Config], TurnPipeline] | None = None,
) -> AsyncIterator[tuple[str, web.Application]]:
    """(base URL, app) of the app with ``settings`` (dotted names) on a free loopback port;
    ``limiter`` replaces the session rate limiter (one on a clock the test moves);
    ``pipeline`` builds the reply pipeline from the config (none: the app listens only)."""
    config = load_config(
        overrides={
            "pipeline.factory": "",
            "transport.video": "false",
            "transport.ice_host_addresses": "127.0.0.1",
            **(settings or {}),
        }
    )
    replies = None if pipeline is None else pipeline(config)
    app = create_app(config, detector_factory(config), replies)
    if limiter is not None:
        app[LIMITER_KEY] = limiter
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}", app
    finally:
        await server.close()
        if replies is not None:
            await replies.close()
