"""Several worker processes on one machine: the supervisor that starts, watches and stops them.

With ``server.workers`` = N > 1, ``python -m server`` becomes a supervisor. It binds one loopback
listening socket per worker and starts N ordinary servers (``python -m server ... --listen-fd``),
each its own process with its own sessions, engines and UDP (ICE) sockets, so sessions can use
more cores than one event loop can. Worker k names its sessions ``wk-<random>``; the router
(server/fleet/router.py) on the public port places new sessions on the least-loaded worker and sends
every later request for a session to the worker in its id. Media and the data channel go
straight to the worker's own sockets.

A worker that exits is reported (log, ``/healthz``, ``/metrics``) and restarted with backoff
(0.5 s doubling to 30 s); one that stops answering ``/healthz`` is marked unhealthy and gets no
new sessions until it answers again. SIGTERM/SIGINT shut down in order: the router stops
accepting, the workers get SIGTERM and are awaited (SIGKILL after a grace period), then exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Coroutine, Sequence
from enum import Enum
from typing import Any

import aiohttp
from aiohttp import web

from server.clock import Clock, MonotonicClock
from server.config import ENV_PREFIX, Config, secret_settings
from server.errors import InvalidTransition
from server.fleet.router import create_router
from server.http.guards import WORKER_KEY_HEADER

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # a worker loading real models (vLLM on CPU) takes 30-60 s
POLL_INTERVAL_S = 1.0  # /healthz of every worker, for load and liveness
HEALTH_TIMEOUT_S = 2.0
UNHEALTHY_AFTER = 3  # consecutive failed polls
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_MS = 30_000.0  # a worker up this long resets the backoff
KILL_GRACE_S = 10.0  # beyond server.shutdown_timeout_s, before SIGKILL
PR_SET_PDEATHSIG = 1
ROUTER_ADDRESS = "127.0.0.1"  # workers listen on, and the router calls from, loopback
WORKER_KEY_ENV = f"{ENV_PREFIX}SERVER_WORKER_KEY"  # server.worker_key, in a worker's environment


class WorkerState(Enum):
    IDLE = "idle"  # not started yet
    STARTING = "starting"  # process started, /healthz not answered yet
    READY = "ready"  # answers /healthz; gets new sessions
    UNHEALTHY = "unhealthy"  # alive but /healthz failed repeatedly; no new sessions
    DOWN = "down"  # exited on its own; a restart is pending
    STOPPING = "stopping"  # sent SIGTERM by the supervisor
    STOPPED = "stopped"


_TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.IDLE: frozenset({WorkerState.STARTING, WorkerState.STOPPING}),
    WorkerState.STARTING: frozenset({WorkerState.READY, WorkerState.DOWN, WorkerState.STOPPING}),
    WorkerState.READY: frozenset({WorkerState.UNHEALTHY, WorkerState.DOWN, WorkerState.STOPPING}),
    WorkerState.UNHEALTHY: frozenset({WorkerState.READY, WorkerState.DOWN, WorkerState.STOPPING}),
    WorkerState.DOWN: frozenset({WorkerState.STARTING, WorkerState.STOPPING}),
    WorkerState.STOPPING: frozenset({WorkerState.STOPPED}),
    WorkerState.STOPPED: frozenset(),
}


class WorkerStartError(RuntimeError):
    """A worker did not become ready when the supervisor started."""


class Worker:
    """One worker process and what the supervisor knows of it."""

    def __init__(self, index: int, sock: socket.socket, clock: Clock) -> None:
        self.index = index
        self.sock = sock  # the listening socket; kept across restarts (stable port)
        self.port = int(sock.getsockname()[1])
        self.state = WorkerState.IDLE
        self.proc: asyncio.subprocess.Process | None = None
        self.sessions = 0  # last /healthz figure, plus sessions placed since it was asked
        self.placements = 0  # sessions the router put here, ever
        self.tasks = 0
        self.process_stats: dict[str, Any] = {}  # rss_bytes, open_fds when the worker has them
        self.restarts = 0
        self.last_exit: int | None = None
        self.failed_polls = 0
        self._clock = clock
        self._since_ms = clock.now_ms()

    @property
    def url(self) -> str:
        return f"http://{ROUTER_ADDRESS}:{self.port}"

    @property
    def accepting(self) -> bool:
        """Whether new sessions may go here."""
        return self.state is WorkerState.READY

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def pid(self) -> int | None:
        """The current (or last) process id."""
        return self.proc.pid if self.proc is not None else None

    def up_ms(self) -> float:
        """Time (ms) in the current state."""
        return self._clock.now_ms() - self._since_ms

    def set_state(self, new: WorkerState) -> None:
        """The one place a worker's state changes."""
        if new is self.state:
            return
        if new not in _TRANSITIONS[self.state]:
            raise InvalidTransition(f"worker {self.index}: {self.state.value} -> {new.value}")
        level = (
            logging.WARNING if new in (WorkerState.DOWN, WorkerState.UNHEALTHY) else logging.INFO
        )
        log.log(
            level, "worker %d (pid %s): %s -> %s", self.index, self.pid, self.state.value, new.value
        )
        self.state = new
        self._since_ms = self._clock.now_ms()

    def placed(self) -> None:
        """The router put a new session here (counted until the next poll)."""
        self.sessions += 1
        self.placements += 1

    def describe(self) -> dict[str, Any]:
        return {
            "worker": self.index,
            "state": self.state.value,
            "sessions": self.sessions,
            "tasks": self.tasks,
            "restarts": self.restarts,
            "last_exit_code": self.last_exit,
            "state_for_s": round(self.up_ms() / 1000, 3),
            **self.process_stats,
        }


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

    The worker trusts the router's X-Forwarded-For (client addresses) and keeps the same
    per-address session rate limit as the router, as a second line.
    """
    proxies = dict.fromkeys((*config.server.trusted_proxies, ROUTER_ADDRESS))
    return [
        sys.executable,
        "-m",
        "server",
        *split_secrets(argv)[0],
        "--set",
        f"server.trusted_proxies={','.join(proxies)}",
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


class Supervisor:
    """Starts ``config.server.workers`` workers, keeps them running, stops them in order."""

    def __init__(self, config: Config, argv: Sequence[str]) -> None:
        self.config = config
        self._argv = list(argv)
        self._clock = MonotonicClock()
        self.workers: list[Worker] = []
        self._lifecycles: list[asyncio.Task[None]] = []
        self._poller: asyncio.Task[None] | None = None
        self._polling: asyncio.Task[None] | None = None  # the poll under way, shared by callers
        self._http: aiohttp.ClientSession | None = None
        self._stopping = False
        # what every request to a worker carries (server/http/guards.py); new for every supervisor
        self.worker_key = secrets.token_urlsafe(32)

    async def start(self) -> None:
        """Start every worker and wait until all answer ``/healthz``; WorkerStartError if not."""
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        count = self.config.server.workers
        firsts: list[asyncio.Future[bool]] = []
        loop = asyncio.get_running_loop()
        for index in range(1, count + 1):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((ROUTER_ADDRESS, 0))
            sock.listen(128)
            worker = Worker(index, sock, self._clock)
            self.workers.append(worker)
            first: asyncio.Future[bool] = loop.create_future()
            firsts.append(first)
            self._lifecycles.append(loop.create_task(self._lifecycle(worker, first)))
        log.info(
            "supervisor: starting %d workers (each loads its own reply pipeline: %s)",
            count,
            self.config.pipeline.factory or "none",
        )
        ready = await asyncio.gather(*firsts)
        failed = [w for w, ok in zip(self.workers, ready, strict=True) if not ok]
        if failed:
            codes = ", ".join(f"worker {w.index}: exit code {w.last_exit}" for w in failed)
            raise WorkerStartError(f"workers did not become ready ({codes}); see their log")
        self._poller = loop.create_task(self._poll_forever())
        log.info("supervisor: %d workers ready (ports %s)", count, [w.port for w in self.workers])

    async def _spawn(self, worker: Worker) -> asyncio.subprocess.Process:
        fd = worker.sock.fileno()
        env = {**os.environ, **split_secrets(self._argv)[1], WORKER_KEY_ENV: self.worker_key}
        proc = await asyncio.create_subprocess_exec(
            *worker_command(self.config, self._argv, worker.index, fd),
            env=env,
            pass_fds=(fd,),
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only
        )
        worker.proc = proc
        worker.failed_polls = 0
        worker.set_state(WorkerState.STARTING)
        log.info("worker %d started (pid %d, port %d)", worker.index, proc.pid, worker.port)
        return proc

    async def _lifecycle(self, worker: Worker, first: asyncio.Future[bool]) -> None:
        """Run one worker for the supervisor's life: start, await its exit, restart."""
        backoff = BACKOFF_FIRST_S
        while not self._stopping:
            proc = await self._spawn(worker)
            ready = await self._wait_ready(worker, proc)
            if not first.done():
                first.set_result(ready)
                if not ready:
                    worker.last_exit = proc.returncode
                    return  # a start failure is fatal: start() stops everything
            if not ready and proc.returncode is None:
                log.error(
                    "worker %d not ready in %.0f s; killing it", worker.index, START_TIMEOUT_S
                )
                proc.kill()
            code = await proc.wait()
            worker.last_exit = code
            if self._stopping:
                return
            worker.restarts += 1
            if worker.up_ms() >= STABLE_AFTER_MS:
                backoff = BACKOFF_FIRST_S
            log.error(
                "worker %d (pid %d) exited with code %d; restarting in %.1f s",
                worker.index,
                proc.pid,
                code,
                backoff,
            )
            worker.set_state(WorkerState.DOWN)
            worker.sessions = worker.tasks = 0
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _health(self, worker: Worker) -> dict[str, Any] | None:
        """The worker's /healthz JSON, or None if it does not answer 200."""
        assert self._http is not None
        try:
            timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            headers = {WORKER_KEY_HEADER: self.worker_key}
            url = f"{worker.url}/healthz"
            async with self._http.get(url, headers=headers, timeout=timeout) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json()
                return data if isinstance(data, dict) else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _wait_ready(self, worker: Worker, proc: asyncio.subprocess.Process) -> bool:
        deadline = self._clock.now_ms() + START_TIMEOUT_S * 1000
        while proc.returncode is None and self._clock.now_ms() < deadline:
            placements = worker.placements
            health = await self._health(worker)
            if health is not None and proc.returncode is None:
                self._apply(worker, health, placements)
                return True
            await asyncio.sleep(0.1)
        return False

    def _apply(self, worker: Worker, health: dict[str, Any], placements: int) -> None:
        """Take a /healthz answer asked for when ``placements`` sessions had been placed."""
        # sessions placed while we asked may be missing from the answer: count them once more
        # (an overcount until the next poll is better than an undercount for placement)
        worker.sessions = int(health.get("sessions", 0)) + worker.placements - placements
        worker.tasks = int(health.get("tasks", 0))
        worker.process_stats = {k: health[k] for k in ("rss_bytes", "open_fds") if k in health}
        worker.failed_polls = 0
        if worker.state in (WorkerState.STARTING, WorkerState.UNHEALTHY):
            worker.set_state(WorkerState.READY)

    async def poll(self) -> None:
        """Ask every running worker for /healthz now (load, liveness). A call while a poll is
        under way waits for that one: a worker gets one question at a time, and a slow one
        counts one failed poll per question, not one per caller."""
        if self._polling is None or self._polling.done():
            self._polling = asyncio.get_running_loop().create_task(self._poll_once())
        await asyncio.shield(self._polling)

    async def _poll_once(self) -> None:
        live = [w for w in self.workers if w.state in (WorkerState.READY, WorkerState.UNHEALTHY)]
        placements = [w.placements for w in live]
        results = await asyncio.gather(*(self._health(w) for w in live))
        for worker, placed, health in zip(live, placements, results, strict=True):
            if worker.state not in (WorkerState.READY, WorkerState.UNHEALTHY):
                continue  # it changed while we asked
            if health is not None:
                self._apply(worker, health, placed)
                continue
            worker.failed_polls += 1
            if worker.failed_polls >= UNHEALTHY_AFTER and worker.alive:
                worker.set_state(WorkerState.UNHEALTHY)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            await self.poll()

    async def stop(self) -> bool:
        """SIGTERM every worker and await it (SIGKILL after a grace period).

        Returns whether every worker that was running exited with code 0.
        """
        self._stopping = True
        tasks = [*self._lifecycles, *(t for t in (self._poller, self._polling) if t is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        grace = self.config.server.shutdown_timeout_s + KILL_GRACE_S
        results = await asyncio.gather(*(self._stop_worker(w, grace) for w in self.workers))
        for worker in self.workers:
            worker.sock.close()
        if self._http is not None:
            await self._http.close()
        return all(results)

    async def _stop_worker(self, worker: Worker, grace_s: float) -> bool:
        proc = worker.proc
        if worker.state is not WorkerState.STOPPED:
            worker.set_state(WorkerState.STOPPING)
        clean = True
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                code = await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                log.error("worker %d did not stop within %.0f s; killing it", worker.index, grace_s)
                proc.kill()
                code = await proc.wait()
            clean = code in (0, -signal.SIGTERM)  # -SIGTERM: stopped before its handler was set
            log.info("worker %d (pid %d) exited with code %d", worker.index, proc.pid, code)
        worker.set_state(WorkerState.STOPPED)
        return clean


async def supervise(config: Config, argv: Sequence[str], stop: asyncio.Event | None = None) -> int:
    """Run the workers and the router until SIGINT/SIGTERM (or ``stop``); the exit code."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    supervisor = Supervisor(config, argv)
    runner: web.AppRunner | None = None
    failed = False
    try:
        if await _until_stopped(supervisor.start(), stop):
            runner = web.AppRunner(
                create_router(config, supervisor, supervisor.worker_key),
                handle_signals=False,
                shutdown_timeout=config.server.shutdown_timeout_s,
            )
            await runner.setup()
            site = web.TCPSite(runner, config.server.host, config.server.port)
            await site.start()
            for addr in runner.addresses:
                log.info(
                    "ready: listening on http://%s:%d/ (GET /healthz), %d workers",
                    addr[0],
                    addr[1],
                    len(supervisor.workers),
                )
            await stop.wait()
        log.info("shutting down: router first, then the workers")
    except WorkerStartError as exc:
        log.error("%s", exc)
        failed = True
    finally:
        if runner is not None:
            await runner.cleanup()  # stop accepting; answer the requests in flight
        clean = await supervisor.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return 0 if clean and not failed else 1


async def _until_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run ``work`` unless ``stop`` is set first (then cancel it); whether it finished."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if task.done():
        task.result()  # raises what start() raised
        return True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return False


def run_supervisor(config: Config, argv: Sequence[str]) -> int:
    """Entry point of ``python -m server --workers N`` (N > 1)."""
    return asyncio.run(supervise(config, argv))
