"""What test clients do on a call, beyond ``server.client.ClientPeer`` itself."""

from __future__ import annotations

import asyncio

from server.client import ClientPeer


async def keep_talking(peer: ClientPeer, replies: list[str], stop: asyncio.Event) -> None:
    """Ask for one reply after another until ``stop`` is set; the last one plays out. Each
    reply's ``response.done`` status goes to ``replies``."""
    while not stop.is_set():
        n = len(peer.events)
        peer.send({"type": "conversation.item.create", "text": "keep talking"})
        done = await peer.wait_event("response.done", timeout=30, after=n)
        replies.append(done["status"])
