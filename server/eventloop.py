"""The event loop the server runs on: asyncio's, with every UDP socket drained when it is ready.

Every WebRTC peer has its own UDP socket (aioice), and each carries 50-70 datagrams a second
from a talking client (audio every 20 ms, SCTP acknowledgements, RTCP, ICE consent checks).
asyncio's selector loop as shipped reads **one** datagram per ready socket per loop
iteration. When an iteration takes longer than a socket's datagrams are apart (tens of
sessions with video, or the DTLS handshakes of a batch of new peers), that socket's backlog
grows in the kernel: the soak test measured up to 450 KB queued on the server's sockets
(seconds of a peer's audio) and drops. The peer's audio then reached the server seconds late,
so the reaper took it for gone, and its ICE consent checks were answered too late, so its
client gave the connection up.

The server's loop reads up to ``DRAIN_DATAGRAMS`` datagrams each time a socket is ready (as
libuv does), so a socket drains in one iteration. uvloop does the same and can be chosen
(``server.event_loop``); on one or two sessions it was slower here (BENCHMARKS.md, "The event
loop drains every peer's socket"). ``asyncio-stock`` is the loop as shipped, for comparison.
"""

from __future__ import annotations

import asyncio
import socket
from asyncio import selector_events
from collections.abc import Callable
from importlib import metadata
from typing import Any

from server.errors import ConfigError

EVENT_LOOPS = ("asyncio", "uvloop", "asyncio-stock")
DRAIN_DATAGRAMS = 32  # datagrams read from one ready socket at most, as libuv's loop does

LoopFactory = Callable[[], asyncio.AbstractEventLoop]
# asyncio's datagram transport (not in its public API nor in typeshed); its reads are replaced
_StockDatagramTransport: Any = selector_events._SelectorDatagramTransport  # type: ignore[attr-defined]


class _DrainingDatagramTransport(_StockDatagramTransport):  # type: ignore[misc]
    """asyncio's datagram transport, reading up to DRAIN_DATAGRAMS datagrams per readiness
    (the stock one reads one); each is handed to the protocol as the stock one does."""

    _sock: socket.socket
    _protocol: asyncio.DatagramProtocol
    _conn_lost: int
    max_size: int

    def _read_ready(self) -> None:
        for _ in range(DRAIN_DATAGRAMS):
            if self._conn_lost:
                return
            try:
                data, addr = self._sock.recvfrom(self.max_size)
            except (BlockingIOError, InterruptedError):
                return  # drained
            except OSError as exc:  # an ICMP error for an earlier send: reported, then on
                self._protocol.error_received(exc)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._fatal_error(exc, "Fatal read error on datagram transport")
                return
            else:
                self._protocol.datagram_received(data, addr)


class DrainingEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop whose UDP sockets are drained (up to DRAIN_DATAGRAMS) each
    time they are ready. Everything else is asyncio's own."""

    def _make_datagram_transport(
        self,
        sock: socket.socket,
        protocol: asyncio.DatagramProtocol,
        address: Any = None,
        waiter: asyncio.Future[None] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> asyncio.DatagramTransport:
        transport: asyncio.DatagramTransport = _DrainingDatagramTransport(
            self, sock, protocol, address, waiter, extra
        )
        return transport


def loop_factory(name: str) -> LoopFactory:
    """What makes the loop called ``name`` (one of ``EVENT_LOOPS``); ConfigError if it cannot
    be made here."""
    if name == "asyncio":
        return DrainingEventLoop
    if name == "asyncio-stock":
        return asyncio.new_event_loop
    if name == "uvloop":
        try:
            import uvloop
        except ImportError as exc:
            raise ConfigError(
                f"server.event_loop: uvloop is not installed ({exc}); install it "
                "(pip install uvloop) or set server.event_loop=asyncio"
            ) from exc
        return uvloop.new_event_loop
    raise ConfigError(f"server.event_loop: must be one of {', '.join(EVENT_LOOPS)}, got {name!r}")


def describe(name: str) -> str:
    """The loop, for the start-up log."""
    if name == "uvloop":
        return f"uvloop {metadata.version('uvloop')}"
    if name == "asyncio-stock":
        return "asyncio as shipped (one datagram per ready socket per iteration)"
    return f"asyncio, up to {DRAIN_DATAGRAMS} datagrams per ready socket"
