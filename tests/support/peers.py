"""What test clients do on a call, beyond ``client.cli.ClientPeer`` itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiortc import RTCPeerConnection

from client.cli import ClientPeer
from server.http.signaling import REGISTRY_KEY
from server.rtc.peer import PeerSession
from tests.support.pace import Patience, within

PATIENCE_STEP_S = 0.5  # how often a wait for an event looks at the load again


class Peer(ClientPeer):
    """``ClientPeer`` whose waits are bounds on the reference machine, stretched by the pace
    the suite measured and by the load while they wait (tests/support/pace.py): what is
    awaited is unchanged."""

    async def connect(self, timeout: float = 15.0, resume_token: str | None = None) -> None:
        await super().connect(within(timeout), resume_token)

    async def wait_event(
        self,
        kind: str,
        timeout: float = 10.0,
        where: Callable[[dict[str, Any]], bool] | None = None,
        after: int = 0,
    ) -> dict[str, Any]:
        patience = Patience(timeout)
        while True:
            step = min(PATIENCE_STEP_S, patience.left())
            try:
                return await super().wait_event(kind, step, where, after)
            except TimeoutError:
                if patience.left() > 0:
                    continue
                seen = [e.get("type") for _, e in self.events[after:]]
                waited = patience.describe()
                raise TimeoutError(f"no {kind!r} event within {waited}; saw {seen}") from None


async def connected(url: str, peers: list[Peer], audio: bool = False) -> Peer:
    """A peer with no video (and no audio unless ``audio``) with its ``session.created``;
    added to ``peers`` (whoever owns the list closes them)."""
    peer = Peer(url, video=False, audio=audio)
    peers.append(peer)
    await peer.connect()
    await peer.wait_event("session.created")
    return peer


def server_side(app: web.Application, peer: Peer) -> PeerSession:
    """The server's peer of ``peer``'s session, in the in-process ``app``."""
    assert peer.session_id is not None
    return app[REGISTRY_KEY].get(peer.session_id)


async def keep_talking(peer: ClientPeer, replies: list[str], stop: asyncio.Event) -> None:
    """Ask for one reply after another until ``stop`` is set; the last one plays out. Each
    reply's ``response.done`` status goes to ``replies``."""
    while not stop.is_set():
        n = len(peer.events)
        peer.send({"type": "conversation.item.create", "text": "keep talking"})
        done = await peer.wait_event("response.done", timeout=30, after=n)
        replies.append(done["status"])


def cut_network(pc: RTCPeerConnection) -> None:
    """The client's network path dies (a phone leaves Wi-Fi): its UDP sockets are aborted.
    Nothing is said to the server: no DTLS close, no SCTP abort, no more packets."""
    transports = {t.sender.transport for t in pc.getTransceivers() if t.sender.transport}
    if pc.sctp is not None:
        transports.add(pc.sctp.transport)
    for dtls in transports:
        for protocol in dtls.transport._connection._protocols:
            protocol.transport.abort()
