"""Start the real server as a subprocess on loopback and wait until /healthz answers.

A test module declares its server in one line, a module-scoped fixture named after the
variable it is assigned to::

    server = server_process({"transport.max_sessions": "2"}, pipeline=TONE_PIPELINE,
                            env=tone_env(500, sentences=1))
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.support.pace import Patience

ROOT = Path(__file__).resolve().parents[2]
TONE_PIPELINE = "tests.support.tone_pipeline:create"
SERVER_FIXTURE = "_starts_a_server_process"  # marks the functions of server_process fixtures


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def terminate(proc: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM ``proc`` if it still runs, wait ``timeout`` s, then SIGKILL; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


class ServerProcess:
    """``python -m server`` with ``settings`` (dotted names) and extra environment;
    ``wrapper``: a command to run it under (e.g. ``scripts/slow.sh``, or ``nsenter`` into a
    network namespace); ``host``/``port``: where it listens (and its ICE host address)."""

    def __init__(
        self,
        settings: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        wrapper: list[str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ):
        self.wrapper = wrapper or []
        self.host = host
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        # max_sessions set: the calibration would make it this machine's capacity (1 on a slow
        # one), and tests open the sessions they need whatever the machine
        self.settings = {
            "transport.ice_host_addresses": host,
            "transport.max_sessions": "4",
            **(settings or {}),
        }
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"avatar-server-{self.port}.log"
        if host != "127.0.0.1":  # hosts in namespaces may share a port
            self.log_path = self.log_path.with_name(f"avatar-server-{host}-{self.port}.log")

    def start(self, timeout: float = 60.0) -> ServerProcess:
        """Start and wait until /healthz answers (``timeout`` s on the reference machine,
        stretched by the measured pace)."""
        args = [*self.wrapper, sys.executable, "-m", "server"]
        args += ["--host", self.host, "--port", str(self.port)]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, text=True
        )
        patience = Patience(timeout)
        while patience.left():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                self.health()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server not ready within {patience.describe()}:\n{self.log()}")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
            return dict(json.loads(resp.read()))

    async def wait_health(
        self, ok: Callable[[dict[str, Any]], bool], timeout: float, what: str, interval: float = 0.1
    ) -> dict[str, Any]:
        """Poll /healthz every ``interval`` s until ``ok(health)``; returns that health. No
        answer or an error status (a supervisor without a ready worker: 503) counts as not
        yet; TimeoutError naming ``what`` after ``timeout`` s (on the reference machine,
        stretched by the measured pace). Each poll runs off the event loop, so the test's own
        peers keep sending while a busy server is slow to answer."""
        patience = Patience(timeout)
        while True:
            try:
                health: dict[str, Any] | OSError = await asyncio.to_thread(self.health)
            except OSError as exc:
                health = exc
            if isinstance(health, dict) and ok(health):
                return health
            if not patience.left():
                waited = patience.describe()
                raise TimeoutError(f"{what}: not reached within {waited}: {health!r}")
            await asyncio.sleep(interval)

    async def wait_sessions(self, count: int, timeout: float) -> dict[str, Any]:
        """/healthz once the server has ``count`` sessions (TimeoutError after ``timeout`` s)."""
        return await self.wait_health(
            lambda h: h["sessions"] == count, timeout, f"{count} sessions"
        )

    async def wait_settled(self, tasks: int, timeout: float) -> dict[str, Any]:
        """/healthz once no session is left and at most ``tasks`` asyncio tasks run. Closing
        peers and connections end their last tasks a little after the session count drops; a
        leaked task never ends, so after ``timeout`` s this fails naming what still runs (the
        census needs ``server.debug_endpoints``)."""
        try:
            return await self.wait_health(
                lambda h: h["sessions"] == 0 and h["tasks"] <= tasks, timeout, f"<= {tasks} tasks"
            )
        except TimeoutError as exc:
            try:
                census = self.debug_sessions()["tasks"]
            except OSError:
                raise exc from None
            raise TimeoutError(f"{exc}; tasks running: {census}") from None

    def worker_pids(self) -> dict[int, int]:
        """The pids of a supervisor's workers by index (``/healthz`` does not show them)."""
        assert self.proc is not None
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        family, grew = {self.proc.pid}, True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in family} - family
            family |= more
            grew = bool(more)
        pids: dict[int, int] = {}
        for pid in family:
            with contextlib.suppress(OSError):
                args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
                if "--worker-index" in args:
                    pids[int(args[args.index("--worker-index") + 1])] = pid
        return pids

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=2) as resp:
            return str(resp.read().decode())

    def debug_sessions(self, token: str | None = None, collect: bool = False) -> dict[str, Any]:
        """GET /debug/sessions (needs ``server.debug_endpoints``; ``token``: the bearer token
        when the server has ``server.auth_tokens``; ``collect``: with ``peer_objects``, counted
        after a garbage collection that holds the server's loop for a while)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        query = "?collect=1" if collect else ""
        request = urllib.request.Request(f"{self.url}/debug/sessions{query}", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as resp:
            return dict(json.loads(resp.read()))

    def session(
        self,
        session_id: str | None,
        which: tuple[str, ...] = ("live", "closed"),
        token: str | None = None,
    ) -> dict[str, Any] | None:
        """The /debug/sessions figures of one session from the ``which`` lists (live or
        recently closed); None if it is in none of them."""
        data = self.debug_sessions(token)
        found = [s for name in which for s in data[name] if s["session_id"] == session_id]
        assert len(found) <= 1, found  # a session is listed once
        return dict(found[0]) if found else None

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful shutdown) and wait; returns the exit code."""
        assert self.proc is not None
        code = terminate(self.proc, timeout)
        self._log.close()
        return code


def metric_value(text: str, name: str, label: str = "") -> float:
    """Sum of a metric's samples named exactly ``name`` in Prometheus text, of those whose
    labels hold ``label`` (such as ``outcome="dropped"``; empty: all of them)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key.split("{")[0] == name and label in key.partition("{")[2]:
            total += float(value)
    return total


def tone_env(ms: float, sentences: int, think_ms: float | None = None) -> dict[str, str]:
    """The environment of the tone pipeline (tests/support/tone_pipeline.py, and the fault
    pipeline's ordinary replies): replies of ``sentences`` sentences of ``ms`` ms each, the first
    after ``think_ms`` ms of thinking."""
    env = {"TONE_PIPELINE_MS": str(ms), "TONE_PIPELINE_SENTENCES": str(sentences)}
    if think_ms is not None:
        env["TONE_PIPELINE_THINK_MS"] = str(think_ms)
    return env


def server_process(
    settings: dict[str, str] | Callable[..., dict[str, str]] | None = None,
    *,
    pipeline: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    exit_code: int | None = 0,
    expect_log: str | None = None,
    log_tail: int | None = None,
    scope: Literal["session", "package", "module", "class", "function"] = "module",
) -> Callable[..., object]:
    """A pytest fixture (``scope``: a module's by default) that starts a ``ServerProcess`` and
    stops it at teardown. Assign it at module level: the fixture takes the variable's name
    (``server = server_process(...)``); tests/conftest.py marks the tests using it ``e2e``.

    ``settings``: dotted settings, or a function that returns them when the fixture starts (its
    parameters name the fixtures it needs, e.g. ``def relayed(coturn: Coturn)``).
    ``pipeline``: the ``pipeline.factory`` (None: the server's own, the real models).
    ``env``: extra environment (``tone_env(...)`` for the tone pipeline).
    ``timeout``: how long ``start`` waits for /healthz (on the reference machine).
    At teardown, after a graceful stop: its exit code must be ``exit_code`` (None: not
    checked) and its log must hold ``expect_log`` if given; a failure shows the log (its last
    ``log_tail`` characters if given)."""

    def fixture(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
        if callable(settings):
            needs = inspect.signature(settings).parameters
            chosen = settings(**{name: request.getfixturevalue(name) for name in needs})
        else:
            chosen = dict(settings or {})
        if pipeline is not None:
            chosen = {"pipeline.factory": pipeline, **chosen}
        proc = ServerProcess(chosen, env=env).start(timeout=timeout)
        yield proc
        code = proc.stop()
        log = proc.log()
        shown = log if log_tail is None else log[-log_tail:]
        if exit_code is not None:
            assert code == exit_code, shown
        if expect_log is not None:
            assert expect_log in log, shown

    setattr(fixture, SERVER_FIXTURE, True)
    return pytest.fixture(fixture, scope=scope)


def is_server_fixture(func: object) -> bool:
    """Whether ``func`` is the function of a fixture that ``server_process`` made."""
    return bool(getattr(func, SERVER_FIXTURE, False))
