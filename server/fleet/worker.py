"""One worker process as the supervisor sees it: its state, its figures, its socket.

The supervisor (server/fleet/workers.py) drives the states; the router (server/fleet/router.py)
reads a worker through the ``Upstream`` protocol (server/fleet/pool.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from enum import Enum
from typing import Any

from server.clock import Clock
from server.errors import InvalidTransition
from server.fleet.launch import ROUTER_ADDRESS

log = logging.getLogger(__name__)


class WorkerState(Enum):
    """A worker's lifecycle; the supervisor moves it (``Worker.set_state``)."""

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
