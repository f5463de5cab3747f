"""A hang-up while ICE is still connecting (security finding: a DELETE ~5 ms after the client
applied the answer left aioice's consent check looping forever, 15 of 15), through real aiortc
peers and the real app served in this process (so the test sees the server's objects).

Each round offers, applies the answer, and DELETEs the session HANG_UP_AFTER_S later, while the
server's ICE agent is between two of its paced checks. Afterwards no task of the server's ICE
objects may remain (aioice's consent check or check list, aiortc's connect) and, after a
collection, no server-side peer (PeerSession or RTCPeerConnection) may be in memory.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import aiohttp
import pytest
from aioice.ice import Connection
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from server.http.signaling import REGISTRY_KEY
from server.rtc.ice_teardown import end_consent_checks_with_close, ice_connections
from tests.support.in_process import running
from tests.support.pace import within

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

ROUNDS = 10
HANG_UP_AFTER_S = 0.005  # after the client applied the answer: the server's ICE is mid-connect
SETTLE_S = 3.0  # how long the server's ICE tasks may take to end after the close


def ice_objects(pc: RTCPeerConnection) -> list[object]:
    """The objects of ``pc`` whose coroutines run as tasks: the connection itself (aiortc's
    connect), its ICE transports and their aioice connections (checks, consent)."""
    transports = [t.receiver.transport.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport.transport)
    return [pc, *transports, *ice_connections(pc)]


def tasks_of(objects: weakref.WeakSet[object]) -> list[asyncio.Task[object]]:
    """Pending tasks whose coroutine is a method of one of ``objects``."""
    found = []
    for task in asyncio.all_tasks():
        frame = task.get_coro().cr_frame  # type: ignore[union-attr]
        owner = None if frame is None else frame.f_locals.get("self")
        if owner is not None and owner in objects:
            found.append(task)
    return found


async def hang_up_right_after_the_answer(
    http: aiohttp.ClientSession, url: str, server_objects: weakref.WeakSet[object], app: object
) -> None:
    """One round: offer, apply the answer, DELETE HANG_UP_AFTER_S later, close the client."""
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    client.createDataChannel("events")
    await client.setLocalDescription(await client.createOffer())
    offer = {"sdp": client.localDescription.sdp, "type": "offer"}
    async with http.post(f"{url}/offer", json=offer) as resp:
        assert resp.status == 200, await resp.text()
        body = await resp.json()
    session_id = body["session_id"]
    peer = app[REGISTRY_KEY].peers[session_id]  # type: ignore[index]
    for obj in ice_objects(peer.pc):
        server_objects.add(obj)
    del peer
    await client.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="answer"))
    # the client's own aioice has the same race; its consent check ends with it too
    end_consent_checks_with_close(client)
    await asyncio.sleep(HANG_UP_AFTER_S)
    async with http.delete(f"{url}/whip/{session_id}") as resp:
        assert resp.status in (200, 204), await resp.text()
    await client.close()


async def test_hang_ups_right_after_the_answer_leave_no_ice_task_and_no_peer() -> None:
    async with running() as (url, app):
        registry = app[REGISTRY_KEY]
        server_objects: weakref.WeakSet[object] = weakref.WeakSet()
        async with aiohttp.ClientSession() as http:
            for _ in range(ROUNDS):
                await hang_up_right_after_the_answer(http, url, server_objects, app)
        assert not registry.conversations and not registry.peers
        deadline = time.monotonic() + within(SETTLE_S)
        left = tasks_of(server_objects)
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            left = tasks_of(server_objects)
        names = sorted(task.get_coro().__qualname__ for task in left)  # type: ignore[union-attr]
        assert not left, (
            f"{len(left)} server ICE tasks still running after {ROUNDS} rounds: {names}"
        )
        gc.collect()
        connections = [obj for obj in server_objects if isinstance(obj, Connection)]
        peers = [obj for obj in server_objects if isinstance(obj, RTCPeerConnection)]
        assert registry.live_peer_objects() == 0
        assert not peers, f"{len(peers)} server RTCPeerConnections still in memory"
        assert not connections, f"{len(connections)} server ICE connections still in memory"
