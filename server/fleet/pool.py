"""What the router needs of the workers (server/fleet/router.py): the supervisor's pool
(server/fleet/workers.py) and each worker in it (server/fleet/worker.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Upstream(Protocol):
    """One worker as the router sees it (server.fleet.worker.Worker)."""

    @property
    def index(self) -> int: ...

    @property
    def url(self) -> str: ...

    @property
    def accepting(self) -> bool: ...

    @property
    def alive(self) -> bool: ...

    @property
    def sessions(self) -> int: ...

    @property
    def restarts(self) -> int: ...

    def placed(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class Pool(Protocol):
    """The workers (server.fleet.workers.Supervisor)."""

    @property
    def workers(self) -> Sequence[Upstream]: ...

    @property
    def draining(self) -> bool:
        """Whether the machine drains: its workers finish their sessions, take no new ones."""
        ...

    async def poll(self) -> None:
        """Refresh every worker's load and liveness now. Concurrent calls share one poll, and
        a caller that is cancelled (timed out) leaves it running for the others."""
        ...
