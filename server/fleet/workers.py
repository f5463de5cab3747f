"""Several worker processes on one machine: the supervisor that starts, watches and stops them.

With ``server.workers`` = N > 1, ``python -m server`` becomes a supervisor. It binds one loopback
listening socket per worker and starts N ordinary servers (``python -m server ... --listen-fd``),
each its own process with its own sessions, engines and UDP (ICE) sockets, so sessions can use
more cores than one event loop can. Worker k names its sessions ``wk-<random>``; the router
(server/fleet/router.py) on the public port places new sessions on the least-loaded worker and sends
every later request for a session to the worker in its id. Media and the data channel go
straight to the worker's own sockets. One worker's state is server/fleet/worker.py, its
command line server/fleet/launch.py.

A worker that exits is reported (log, ``/healthz``, ``/metrics``) and restarted with backoff
(0.5 s doubling to 30 s); one that stops answering ``/healthz`` is marked unhealthy and gets no
new sessions until it answers again. SIGTERM/SIGINT shut down in order: the router stops
accepting, the workers get SIGTERM and are awaited (SIGKILL after a grace period), then exit.
With ``server.drain_timeout_s`` the first SIGTERM drains first: the router refuses new sessions
(503 "draining") but keeps serving the live ones, every worker gets SIGTERM and drains (its
sessions finish, then it exits; none is restarted), and once all have exited the supervisor
shuts down. SIGINT, or a second SIGTERM, shuts down at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from server.clock import MonotonicClock
from server.config import Config
from server.eventloop import loop_factory
from server.fleet.launch import ROUTER_ADDRESS, WORKER_KEY_ENV, split_secrets, worker_command
from server.fleet.router import create_router
from server.fleet.worker import Worker, WorkerState
from server.http.guards import WORKER_KEY_HEADER

# WORKER_KEY_ENV, split_secrets and worker_command live in server/fleet/launch.py; they are
# imported from here too (tests/server/http/test_guards.py)
__all__ = [
    "WORKER_KEY_ENV",
    "Supervisor",
    "WorkerStartError",
    "run_supervisor",
    "split_secrets",
    "supervise",
    "worker_command",
]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # a worker loading real models (vLLM on CPU) takes 30-60 s
POLL_INTERVAL_S = 1.0  # /healthz of every worker, for load and liveness
HEALTH_TIMEOUT_S = 2.0
UNHEALTHY_AFTER = 3  # consecutive failed polls
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_MS = 30_000.0  # a worker up this long resets the backoff
KILL_GRACE_S = 10.0  # beyond server.shutdown_timeout_s, before SIGKILL


class WorkerStartError(RuntimeError):
    """A worker did not become ready when the supervisor started."""


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
        self.draining = False  # the workers finish their sessions; none is restarted
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
        while not self._stopping and not self.draining:
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
            if self._stopping or self.draining:
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
                if resp.status not in (200, 503):
                    return None
                data = await resp.json()
                # a draining worker answers 503: alive, serving its own sessions
                fine = resp.status == 200 or (isinstance(data, dict) and data.get("draining"))
                return data if fine and isinstance(data, dict) else None
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

    async def drain(self) -> None:
        """SIGTERM every worker, which drains (its sessions finish, then it exits), and wait
        until all have exited; none is restarted. The router refuses new sessions meanwhile."""
        self.draining = True
        live = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        log.info("supervisor: draining %d workers", len(live))
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*(proc.wait() for proc in live))
        log.info("supervisor: every worker has drained")

    async def stop(self) -> bool:
        """SIGTERM every worker and await it (SIGKILL after a grace period).

        Returns whether every worker that was running exited with code 0.
        """
        self._stopping = True
        tasks = [*self._lifecycles, *(t for t in (self._poller, self._polling) if t is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        server = self.config.server  # a worker with a drain time drains on SIGTERM first
        grace = server.drain_timeout_s + server.shutdown_timeout_s + KILL_GRACE_S
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
            try:  # not wait_for: 3.11's can swallow a cancel that comes as the process ends
                async with asyncio.timeout(grace_s):
                    code = await proc.wait()
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
    drain = asyncio.Event()
    loop = asyncio.get_running_loop()

    def terminate() -> None:  # the first SIGTERM drains when a drain time is set
        if config.server.drain_timeout_s > 0 and not drain.is_set():
            drain.set()
        else:
            stop.set()

    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, terminate)
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
            if await _until_stopped(drain.wait(), stop):
                await _until_stopped(supervisor.drain(), stop)
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


async def _until_stopped(work: Coroutine[Any, Any, object], stop: asyncio.Event) -> bool:
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
    """Entry point of ``python -m server --workers N`` (N > 1), on ``server.event_loop``."""
    with asyncio.Runner(loop_factory=loop_factory(config.server.event_loop)) as runner:
        return runner.run(supervise(config, argv))
