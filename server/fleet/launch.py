"""Launching a worker process: its command line and environment, and, in the worker, the
tie to the supervisor's life (server/fleet/workers.py starts the processes)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Sequence

from server.config import ENV_PREFIX, Config, secret_settings

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
ROUTER_ADDRESS = "127.0.0.1"  # workers listen on, and the router calls from, loopback
WORKER_KEY_ENV = f"{ENV_PREFIX}SERVER_WORKER_KEY"  # server.worker_key, in a worker's environment


def split_secrets(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``argv`` without its ``--set`` of secret settings (tokens, TURN and API secrets), and
    those as ``AVATAR_*`` environment variables: a worker's command line shows in ``ps``."""
    env_names = secret_settings()
    kept: list[str] = []
    env: dict[str, str] = {}
    items = iter(argv)
    for arg in items:
        value = next(items, "") if arg == "--set" else arg[len("--set=") :]
        if arg != "--set" and not arg.startswith("--set="):
            kept.append(arg)
            continue
        dotted, _, setting = value.partition("=")
        if dotted.strip() in env_names:
            env[env_names[dotted.strip()]] = setting
        else:
            kept += ["--set", value]
    return kept, env


def worker_command(config: Config, argv: Sequence[str], index: int, fd: int) -> list[str]:
    """The command line of worker ``index``: the supervisor's own options (without secrets,
    see split_secrets), then one worker.

    The worker trusts only the router's X-Forwarded-For, which names the client alone (the
    router read it past its own trusted proxies), and keeps the same per-address session rate
    limit as the router, as a second line; its session ids carry the host's prefix and
    ``wk-`` (``h1.w2-...``), so a proxy in front still routes by host.
    """
    return [
        sys.executable,
        "-m",
        "server",
        *split_secrets(argv)[0],
        "--set",
        f"server.trusted_proxies={ROUTER_ADDRESS}",
        "--workers",
        "1",
        "--worker-index",
        str(index),
        "--listen-fd",
        str(fd),
        "--supervisor-pid",
        str(os.getpid()),
    ]


def become_worker(supervisor_pid: int | None) -> None:
    """In a worker: get SIGTERM (a graceful shutdown) when the supervisor dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("cannot ask for SIGTERM on supervisor exit (errno %d)", ctypes.get_errno())
    if supervisor_pid is not None and os.getppid() != supervisor_pid:
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor died before we asked
