"""The server's event loop drains a peer's UDP socket in a few loop iterations, however many
datagrams queued while the loop was busy (server/eventloop.py says why that matters)."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvloop

from server.config import load_config
from server.errors import ConfigError
from server.eventloop import DRAIN_DATAGRAMS, DrainingEventLoop, describe, loop_factory

BACKLOG = 200  # datagrams queued while the loop was busy: 4 s of a peer's audio
MAX_ITERATIONS = 1000  # the count is bounded: a loop that never drains fails, not hangs


class Counting(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received = 0

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.received += 1


async def iterations_to_drain() -> int:
    """Loop iterations until a socket with BACKLOG queued datagrams has delivered them all."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Counting, local_addr=("127.0.0.1", 0))
    try:
        address = transport.get_extra_info("sockname")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for n in range(BACKLOG):  # the loop runs nothing meanwhile: all of them queue
                sender.sendto(n.to_bytes(2, "big") * 80, address)
        iterations = 0
        while protocol.received < BACKLOG and iterations < MAX_ITERATIONS:
            await asyncio.sleep(0)  # one pass of the loop: ready sockets are read once each
            iterations += 1
        assert protocol.received == BACKLOG
        return iterations
    finally:
        transport.close()


def run_on(name: str) -> int:
    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        return runner.run(iterations_to_drain())


@pytest.mark.parametrize("name", ["asyncio", "uvloop"])
def test_the_loops_drain_a_socket_in_a_few_iterations(name: str) -> None:
    assert run_on(name) <= BACKLOG // DRAIN_DATAGRAMS + 3  # up to 32 datagrams a wakeup


def test_the_default_is_asyncio_draining() -> None:
    assert load_config(env={}).server.event_loop == "asyncio"
    assert loop_factory("asyncio") is DrainingEventLoop


def test_asyncio_as_shipped_reads_one_datagram_per_iteration() -> None:
    """Why the server's loop drains: a backlog lasts as many iterations as it has datagrams."""
    assert run_on("asyncio-stock") >= BACKLOG - 1


def test_a_drained_socket_reports_errors_and_stays_open() -> None:
    """An ICMP error (a send to a closed port, on a connected socket) is reported to the
    protocol as asyncio's transport does, and the transport stays open."""

    async def errors() -> tuple[int, bool]:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as closed:
            closed.bind(("127.0.0.1", 0))
            gone = closed.getsockname()
        seen: list[OSError] = []

        class Noting(Counting):
            def error_received(self, exc: Exception) -> None:
                assert isinstance(exc, OSError)
                seen.append(exc)

        transport, _ = await loop.create_datagram_endpoint(Noting, remote_addr=gone)
        try:
            transport.sendto(b"x")  # ECONNREFUSED comes back on this socket
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            return len(seen), transport.is_closing()
        finally:
            transport.close()

    with asyncio.Runner(loop_factory=loop_factory("asyncio")) as runner:
        assert runner.run(errors()) == (1, False)


def test_the_loop_is_what_the_setting_names() -> None:
    kinds = {"uvloop": uvloop.Loop, "asyncio": DrainingEventLoop}
    for name, kind in {**kinds, "asyncio-stock": asyncio.SelectorEventLoop}.items():
        loop = loop_factory(name)()
        assert type(loop) is kind
        loop.close()
    assert describe("uvloop").startswith("uvloop ")
    with pytest.raises(ConfigError, match=r"server\.event_loop"):
        loop_factory("tokio")
    with pytest.raises(ConfigError, match=r"server\.event_loop"):
        load_config(env={}, overrides={"server.event_loop": "tokio"})
