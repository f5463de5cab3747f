"""aioice's consent checks end with the peer connection, however early it is closed.

Written against aioice 0.13.0 (``aioice/ice.py``) under aiortc 1.16.0. ``Connection.connect()``
paces its connectivity checks with 20 ms sleeps, then takes the check list's outcome from a
queue and, when it completed, starts the consent-freshness task (``query_consent``, RFC 7675).
If the check list completes (the client nominated a pair) and the connection is closed while
connect() is still in one of those sleeps (a hang-up ~5 ms after the client applied the
answer), ``close()`` finds no consent task to cancel and leaves "completed" queued; connect()
then wakes, reads it and starts ``query_consent`` on the closed connection. Nothing cancels it:
its nominated pairs were cleared by the close, so it sends nothing and never fails, and it
wakes every ~5 s for ever, holding the connection. aiortc runs connect() in a task of its own
that nobody awaits, so each connection's ``connect`` is wrapped (an instance attribute, nothing
global): when the original returns on a connection that is closing, the consent task it just
started is cancelled and awaited there.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from aioice.ice import Connection
from aiortc import RTCPeerConnection

from server.tasks import cancel


def ice_connections(pc: RTCPeerConnection) -> list[Connection]:
    """The aioice connections under ``pc``'s transports (one when bundled); each once."""
    transports = [t.receiver.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    found: dict[int, Connection] = {}
    for dtls in transports:
        connection = dtls.transport._connection
        found[id(connection)] = connection
    return list(found.values())


def _bounded(connection: Connection) -> Callable[[], Coroutine[Any, Any, None]]:
    connect = connection.connect

    async def connect_then_end_consent_if_closed() -> None:
        await connect()
        if connection._closing:  # closed before connect() read the outcome: close() missed it
            task, connection._query_consent_task = connection._query_consent_task, None
            await cancel(task)

    return connect_then_end_consent_if_closed


def end_consent_checks_with_close(pc: RTCPeerConnection) -> int:
    """Make the consent checks of ``pc``'s ICE connections end when they close, even when
    closed mid-connect; call after setRemoteDescription (the transports exist) and before
    setLocalDescription (which starts connecting). Returns how many connections were newly
    wrapped; idempotent."""
    wrapped = 0
    for connection in ice_connections(pc):
        if getattr(connection, "_avatar_consent_bounded", False):
            continue
        connection.connect = _bounded(connection)  # type: ignore[method-assign]
        connection._avatar_consent_bounded = True  # type: ignore[attr-defined]
        wrapped += 1
    return wrapped
