"""Command line: ``python -m server --host H --port P [--config FILE] [--set KEY=VALUE ...]``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from server import __version__
from server.avatar.seam import AvatarRenderer
from server.avatar.video import frame_cost_ms
from server.config import Config, describe, load_config
from server.errors import ConfigError
from server.eventloop import describe as describe_loop
from server.eventloop import loop_factory
from server.fleet.launch import become_worker
from server.fleet.workers import run_supervisor
from server.http import logfilter
from server.http.app import create_app
from server.http.auth import exposure_warning
from server.http.registry import SessionRegistry
from server.http.signaling import REGISTRY_KEY
from server.machine import this_machine
from server.pipeline.calibration import Calibration, StageCosts, adapt, calibrate, quota_use
from server.pipeline.cpuplan import limit_blas_threads, running_cores
from server.pipeline.seams import OnLadder, Tunable, TurnPipeline, WarmsUp, load_pipeline
from server.pipeline.wiring import avatar_renderer, detector_factory, vision_model
from server.priority import share_the_gil

log = logging.getLogger("server")
LLM_WARM_UP = "llm_first_token_ms"  # the calibration's fallback where the LLM's warm-up failed
DRAIN_POLL_S = 0.2  # how often a drain looks whether the live sessions have ended


def _settings_help() -> str:
    lines = ["settings (TOML [section] key, environment variable, default):"]
    for dotted, env, default, help_text in describe():
        lines.append(f"  {dotted:<34} {env}")
        lines.append(f"      {help_text} Default: {default!r}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m server",
        description="Realtime avatar/voice server.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", help="bind address (server.host)")
    parser.add_argument("--port", help="TCP port (server.port)")
    parser.add_argument("--config", type=Path, help="TOML configuration file")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (server.log_level)")
    parser.add_argument("--workers", help="worker processes (server.workers)")
    # set by the supervisor (server/fleet/workers.py) for its workers: the inherited listening
    # socket, the worker's index (its session-id prefix) and the supervisor's pid
    parser.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--supervisor-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any setting by its dotted name, e.g. runtime.lookahead_budget_ms=1500",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    parser.add_argument("--version", action="version", version=__version__)
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    """Defaults < --config file < AVATAR_* environment < command-line options."""
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = value
    for dotted, value in (
        ("server.host", args.host),
        ("server.port", args.port),
        ("server.log_level", args.log_level),
        ("server.workers", args.workers),
    ):
        if value is not None:
            overrides[dotted] = value
    config = load_config(args.config, os.environ, overrides)
    if args.worker_index:  # worker k of a supervisor: the host's prefix, then "wk-" ("h1.w2-")
        prefix = f"{config.server.session_id_prefix}w{args.worker_index}-"
        config = load_config(
            args.config, os.environ, {**overrides, "server.session_id_prefix": prefix}
        )
    return config


async def serve(
    config: Config, stop: asyncio.Event | None = None, listen_fd: int | None = None
) -> None:
    """Run the server until SIGINT/SIGTERM (or ``stop``), then shut down in order.

    ``listen_fd``: serve on this inherited listening socket instead of host:port (a worker).
    """
    stop = stop or asyncio.Event()
    drain = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if sig is signal.SIGTERM and config.server.drain_timeout_s > 0 and not drain.is_set():
            drain.set()  # the first SIGTERM drains; SIGINT or a second SIGTERM stops
        else:
            stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    pipeline = await load_pipeline(config)
    log.info("reply pipeline: %s", config.pipeline.factory or "none (listen only)")
    times: dict[str, float | None] = {}
    if isinstance(pipeline, WarmsUp):
        log.info("warming up the engines: their first calls, before the first conversation")
        times = await pipeline.warm_up()
        log.info(
            "engines warm: %s",
            ", ".join(f"{k} {'failed' if v is None else f'{v:.0f}'}" for k, v in times.items()),
        )
    renderer = avatar_renderer(config) if config.transport.video else None
    calibration = None
    if isinstance(pipeline, WarmsUp):  # engines that were timed (not a test's stand-in)
        config, renderer, calibration = await calibrate_server(config, pipeline, renderer, times)
    vision = vision_model(config) if config.vision.enabled else None
    limit_blas_threads()  # the BLAS the models brought (OpenCV's), as numpy's at start
    app = create_app(config, detector_factory(config), pipeline, renderer, vision, calibration)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        shutdown_timeout=config.server.shutdown_timeout_s,
        # a worker's requests come through the supervisor's router, which logs them
        access_log=None if listen_fd is not None else logging.getLogger("aiohttp.access"),
    )
    await runner.setup()
    try:
        site: web.BaseSite = (
            web.SockSite(runner, socket.socket(fileno=listen_fd))
            if listen_fd is not None
            else web.TCPSite(runner, config.server.host, config.server.port)
        )
        await site.start()
        for addr in runner.addresses:
            log.info("ready: listening on http://%s:%d/ (GET /healthz)", addr[0], addr[1])
        await first_of(stop, drain)
        if not stop.is_set():
            await drain_sessions(app[REGISTRY_KEY], config.server.drain_timeout_s, stop)
        log.info("shutting down")
    finally:
        await runner.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        log.info("stopped")


async def first_of(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def drain_sessions(registry: SessionRegistry, timeout_s: float, stop: asyncio.Event) -> None:
    """Refuse new sessions and wait until the live ones have ended (a session kept for a
    resume counts until its window closes), ``timeout_s`` at most or until ``stop``."""
    registry.drain()
    deadline = time.monotonic() + timeout_s
    while len(registry) and not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning("drain deadline: %d sessions still live, closing them", len(registry))
            return
        with contextlib.suppress(TimeoutError):  # not wait_for: 3.11's can swallow a cancel
            async with asyncio.timeout(min(DRAIN_POLL_S, left)):
                await stop.wait()
    log.info("drained: no session left" if not len(registry) else "drain cut short")


async def calibrate_server(
    config: Config,
    pipeline: TurnPipeline,
    renderer: AvatarRenderer | None,
    times: Mapping[str, float | None],
) -> tuple[Config, AvatarRenderer | None, Calibration]:
    """Time one avatar frame, predict the reply and capacity from the warm-up, and choose the
    settings the operator left unset; a new renderer if the video size changed.

    Where the pipeline's LLM is a rung of the model ladder, each rung loaded is predicted
    with the settings it would get; a rung that misses ``pipeline.latency_budget_ms`` makes
    way for the next smaller one (server/pipeline/ladder.py), and the pick's figures count."""
    frame_ms = None
    if renderer is not None:
        try:
            fps = config.transport.video_fps
            frame_ms = await asyncio.to_thread(frame_cost_ms, renderer, fps)
        except Exception as exc:  # a failed measurement falls back to the reference figure
            log.warning("calibration: the avatar frame failed: %s: %s", type(exc).__name__, exc)
    pixels = config.transport.video_width * config.transport.video_height
    machine = this_machine()
    cpus, use = machine.cpus, quota_use(machine.cpu_quota, len(running_cores()))

    def predict(
        stage_times: Mapping[str, float | None],
    ) -> tuple[Config, dict[str, object], Calibration]:
        costs = StageCosts.from_warm_up(stage_times, frame_ms, pixels)
        adapted, changed = adapt(config, calibrate(costs, config, cpus, use))
        return adapted, changed, calibrate(costs, adapted, cpus, use)  # with those settings

    chosen, changed, calibration = predict(times)
    climb = pipeline.climb if isinstance(pipeline, OnLadder) else None
    if climb is not None:
        assert isinstance(pipeline, OnLadder)
        while (rung := climb.pending) is not None:
            # a model that wrote nothing in its warm-up is predicted never to answer
            silent = LLM_WARM_UP in calibration.fallbacks
            heard = math.inf if silent else calibration.predicted_heard_ms
            climb.measured(rung, heard, calibration.capacity)
            if not await pipeline.load_next_rung():
                break
            times = {**times, **await pipeline.warm_up_llm()}
            chosen, changed, calibration = predict(times)
        choice = climb.choice()
        log.info("model ladder: %s, %s", choice.model, choice.reason)
        calibration = dataclasses.replace(calibration, llm=choice)
    if changed:
        log.info(
            "calibration: settings chosen for this machine (set them to override): %s",
            ", ".join(f"{k}={v}" for k, v in changed.items()),
        )
    log.info("calibration: %s", calibration.describe())
    if isinstance(pipeline, Tunable):
        pipeline.tune(chosen.pipeline, calibration.stage_share)
    size = ("transport.video_width", "transport.video_height")
    if renderer is not None and any(name in changed for name in size):
        renderer = avatar_renderer(chosen)
    return chosen, renderer, calibration


def bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (``"127.0.0.1:8080 is in use"``), or None.

    Each address ``host`` names is bound and let go at once, as asyncio's server binds them
    (SO_REUSEADDR, IPv6 only on IPv6): said before the models load (tens of seconds), not as
    a traceback after. Port 0 (any free port) is never a problem.
    """
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICSERV
        )
    except socket.gaierror as exc:
        return f"{host}:{port}: {exc.strerror}"
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # a family this machine lacks (IPv6 off): asyncio skips it too
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                where = (
                    f"[{address[0]}]:{port}"
                    if family == socket.AF_INET6
                    else f"{address[0]}:{port}"
                )
                if exc.errno == errno.EADDRINUSE:
                    return f"{where} is in use"
                return f"{where}: {exc.strerror}"
    return None


def port_problem(config: Config, listen_fd: int | None) -> str | None:
    """The first port this process would listen on that it cannot, said with the option that
    changes it; None if all are free. A worker (``listen_fd``) serves on the supervisor's
    socket, so the public port is not its own to check."""
    server = config.server
    if listen_fd is None:
        problem = bind_problem(server.host, server.port)
        if problem is not None:
            return f"{problem}; pass --port another port (server.port)"
    if server.agent_port:
        problem = bind_problem(server.host, server.agent_port)
        if problem is not None:
            return f"{problem}; set server.agent_port to another port"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"error: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config)
        return 0
    # before any model loads: a port in use is one line now, not a traceback in 20 s
    problem = port_problem(config, args.listen_fd)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    tag = f"[w{args.worker_index}] " if args.worker_index else ""
    logging.basicConfig(
        level=config.server.log_level,
        format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s",
    )
    logfilter.install(logging.getLogger().handlers)  # no whole session id in any log line
    if config.server.log_level != "DEBUG":
        logging.getLogger("aioice").setLevel(logging.WARNING)
    log.info("avatar-server %s starting (config: %s)", __version__, args.config or "defaults")
    log.info("runtime: lookahead budget %d ms", config.runtime.lookahead_budget_ms)
    log.info("scheduler: policy %s", config.scheduler.policy)
    # a worker serves on the supervisor's loopback socket: the public bind is not its own
    exposed = (
        exposure_warning(config.server.host, config.server.auth_tokens)
        if args.listen_fd is None
        else None
    )
    if exposed:
        log.warning(exposed)
    if config.server.workers > 1:
        return run_supervisor(config, sys.argv[1:] if argv is None else argv)
    if args.listen_fd is not None:
        become_worker(args.supervisor_pid)
    share_the_gil()  # the loop waits at most 1 ms for the GIL behind a worker thread
    limit_blas_threads()  # numpy's OpenBLAS: no pool thread spinning beside the loop
    try:
        new_loop = loop_factory(config.server.event_loop)
        log.info("event loop: %s", describe_loop(config.server.event_loop))
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(serve(config, listen_fd=args.listen_fd))
    except ConfigError as exc:
        print(f"error: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
