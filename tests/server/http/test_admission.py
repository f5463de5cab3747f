"""Admission counts live work: a conversation waiting for a resume holds no session slot.

Before, a client that left without ``DELETE`` (a tab closed, an app killed, a phone out of
coverage) kept a whole slot for ``session.resume_window_s``: with ``max_sessions=2`` the third
client in a row got 503. Now the waiting conversations are counted apart, within a bound of
their own (the oldest ends first, its token then gets 410), and a full server lets go of a
peer whose audio stopped before it refuses anyone. Real aiortc peers; half of them close their
connection, half vanish without a word.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable

import aiohttp
import pytest

from server.http.detached import DetachedBound, Waiting, evictions
from server.http.registry import SessionRegistry
from server.http.signaling import REGISTRY_KEY
from tests.support.in_process import running
from tests.support.pace import within
from tests.support.peers import Peer, cut_network
from tests.support.server_process import ROOT

MB = 1_000_000


async def until(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + within(timeout_s)
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)


async def health(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with http.get(url + "/healthz") as resp:
        body = await resp.json()
        return {k: body[k] for k in ("sessions", "detached_sessions")}


async def call_and_leave(url: str, registry: SessionRegistry, vanish: bool) -> Peer:
    """A client connects, hears the server for a moment and leaves without DELETE: it closes
    its peer connection, or (``vanish``) its network path dies. Returns the peer (its resume
    token kept)."""
    peer = Peer(url, video=False)
    await peer.connect()
    await peer.wait_event("session.created")
    await until(lambda: len(peer.audio) >= 10, "audio from the server", 10)
    if vanish:
        cut_network(peer.pc)
    else:
        await peer.pc.close()
        await until(lambda: peer.session_id not in registry.peers, "the hang-up noticed", 10)
    return peer


async def test_the_third_and_tenth_client_get_in_while_detached_conversations_wait() -> None:
    """Ten clients one after another on a server of two slots, each leaving without DELETE
    (even ones close their connection, odd ones vanish): every one is admitted, the ones
    that left wait for a resume, and a resume still works after the tenth."""
    settings = {"transport.max_sessions": "2", "transport.stale_peer_s": "0.5"}
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        registry = app[REGISTRY_KEY]
        peers = []
        try:
            for i in range(10):
                peers.append(await call_and_leave(url, registry, vanish=i % 2 == 1))
            ids = [p.session_id for p in peers]
            assert all(i in registry.conversations for i in ids), "a conversation ended"
            assert registry.live <= 2 and registry.live + registry.detached == 10
            seen = await health(http, url)
            assert seen == {"sessions": registry.live, "detached_sessions": registry.detached}
            assert seen["detached_sessions"] >= 8
            first = peers[0]
            await first.resume()
            assert first.session_id == ids[0] and ids[0] in registry.peers
            assert (await health(http, url))["detached_sessions"] == registry.detached
        finally:
            for peer in peers:
                await peer.close()
        assert len(registry) == 0


async def test_the_detached_bound_ends_the_oldest_and_its_token_gets_410() -> None:
    settings = {"transport.max_sessions": "2", "session.max_detached": "2"}
    async with running(settings) as (url, app):
        registry = app[REGISTRY_KEY]
        peers = []
        try:
            for _ in range(3):
                peers.append(await call_and_leave(url, registry, vanish=False))
            oldest, kept, newest = peers
            await until(lambda: oldest.session_id not in registry.conversations, "eviction", 5)
            assert [kept.session_id, newest.session_id] == list(registry.conversations)
            with pytest.raises(RuntimeError, match="410"):
                await oldest.resume()
            await kept.resume()
            assert registry.live == 1 and registry.detached == 1
        finally:
            for peer in peers:
                await peer.close()


async def test_a_resume_is_live_work_refused_while_full_and_its_token_kept() -> None:
    """A resume on a full server gets 503 and changes nothing: the same token works once a
    slot is free."""
    async with running({"transport.max_sessions": "1"}) as (url, app):
        registry = app[REGISTRY_KEY]
        left = await call_and_leave(url, registry, vanish=False)
        other = Peer(url, video=False)
        try:
            await other.connect()  # admitted: the one that left holds no slot
            token = left.resume_token
            with pytest.raises(RuntimeError, match="503"):
                await left.resume()
            left.resume_token = token
            assert left.session_id in registry.conversations and registry.detached == 1
            await other.close()
            await left.resume()
            assert registry.live == 1 and registry.detached == 0
        finally:
            await left.close()
            await other.close()


def test_evictions_keep_each_bound_oldest_first() -> None:
    def w(i: int, client: str = "", held: int = MB) -> Waiting:
        return Waiting(f"s{i}", client, float(i), held)

    loose = DetachedBound(count=10, per_client=10, bytes=100 * MB)
    assert evictions([w(2), w(1)], loose) == []
    assert evictions([w(3), w(1), w(2)], DetachedBound(2, 10, 100 * MB)) == ["s1"]
    # one client past its share loses its oldest, whoever else is older
    crowd = [w(1, "a"), w(2, "b"), w(3, "b"), w(4, "b")]
    assert evictions(crowd, DetachedBound(10, 2, 100 * MB)) == ["s2"]
    # clients unknown ('' : loopback) have no share of their own
    assert evictions([w(1), w(2), w(3)], DetachedBound(10, 1, 100 * MB)) == []
    # bytes: the oldest go until the rest fit
    heavy = [w(1, held=5 * MB), w(2, held=3 * MB), w(3, held=3 * MB)]
    assert evictions(heavy, DetachedBound(10, 10, 6 * MB)) == ["s1"]
    assert evictions(heavy, DetachedBound(10, 10, 2 * MB)) == ["s1", "s2", "s3"]
    assert evictions(heavy, DetachedBound(0, 10, 100 * MB)) == ["s1", "s2", "s3"]


async def test_the_command_line_client_hangs_up_when_stopped() -> None:
    """``python -m client`` stopped by SIGTERM (or Ctrl-C) hangs up on its way out: its
    conversation ends at once instead of waiting for a resume."""
    async with running() as (url, app):
        registry = app[REGISTRY_KEY]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "client",
            "--url",
            url,
            "--no-video",
            "--duration",
            "120",
            "--pin-host",
            "127.0.0.1",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await until(lambda: registry.live == 1, "the client's session", 20)
            await until(lambda: any(c.attached for c in registry.conversations.values()), "", 10)
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), within(30))
            assert proc.returncode == 0, err.decode()
            assert "hanging up" in err.decode()
            assert len(registry) == 0, "the conversation waits for a resume"
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
