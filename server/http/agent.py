"""The load-balancer agent: HAProxy's ``agent-check`` protocol on its own TCP port.

A proxy in front of several hosts sends each new session to a host with room for it. Each
connection to the agent reads one line and is closed: ``up <n>%`` where ``n`` is the share of
``transport.max_sessions`` still free (the proxy scales the host's weight by it: 0 % takes no
new session), or ``drain`` while the host drains (server/__main__.py). Session-scoped requests
do not depend on it: the proxy routes them by the session id's prefix (docs/operations.md, "Many
hosts").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def agent_line(sessions: int, max_sessions: int, draining: bool) -> str:
    """The agent's answer for a host holding ``sessions`` of ``max_sessions``."""
    if draining:
        return "drain\n"
    free = max(0, max_sessions - sessions)
    return f"up {round(100 * free / max(1, max_sessions))}%\n"


async def serve_agent(
    host: str, port: int, state: Callable[[], tuple[int, int, bool]]
) -> asyncio.Server:
    """Start the agent on ``host``:``port``; ``state`` gives (sessions, max, draining)."""

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(agent_line(*state()).encode())
            await writer.drain()
        except ConnectionError:
            pass  # the proxy went away first
        finally:
            writer.close()

    server = await asyncio.start_server(answer, host, port)
    log.info("load-balancer agent on %s:%d (HAProxy agent-check)", host, port)
    return server
