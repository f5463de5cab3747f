"""Draining a host: a SIGTERM (with ``server.drain_timeout_s``) refuses new sessions, answers
/healthz with 503 "draining" so a proxy takes the host out of rotation, lets the live sessions
finish their replies, and exits when the last one has ended or at the deadline; with
``--workers``, through the supervisor's router. Real server processes, real aiortc peers, the
tone pipeline."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest

from tests.support.offers import trickle_offer
from tests.support.pace import within
from tests.support.peers import Peer
from tests.support.server_process import TONE_PIPELINE, ServerProcess, tone_env


def health(server: ServerProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def until_draining(server: ServerProcess) -> dict[str, Any]:
    deadline = time.monotonic() + within(10)
    while time.monotonic() < deadline:
        status, body = await asyncio.to_thread(health, server)
        if body["draining"]:
            assert status == 503 and body["status"] == "draining"
            return body
        await asyncio.sleep(0.05)
    raise AssertionError("the server never said it was draining")


def draining_server(drain_s: float) -> ServerProcess:
    settings = {
        "pipeline.factory": TONE_PIPELINE,
        "server.drain_timeout_s": str(drain_s),
        "transport.video": "false",
    }
    return ServerProcess(settings, env=tone_env(2000, sentences=2)).start(timeout=60)


async def test_a_draining_host_finishes_its_sessions_refuses_new_ones_and_exits(
    client_ice: None,
) -> None:
    server = draining_server(60)
    peer = Peer(server.url, video=False)
    try:
        await peer.connect()
        status, body = await asyncio.to_thread(health, server)
        assert status == 200 and body["status"] == "ok" and not body["draining"]
        n = len(peer.events)
        peer.send({"type": "conversation.item.create", "text": "tell me something"})
        await peer.wait_event("response.audio_transcript.delta", timeout=20, after=n)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        body = await until_draining(server)
        assert body["sessions"] == 1
        # a new session is refused, with a Retry-After (a proxy's health check moves on)
        newcomer = Peer(server.url, video=False, whip=True)
        with pytest.raises(RuntimeError, match=r"WHIP 503.*draining"):
            await newcomer.connect()
        await newcomer.close()
        # the live one plays its reply to its end, and can ask for another
        done = await peer.wait_event("response.done", timeout=30, after=n)
        assert done["status"] == "completed"
        n = len(peer.events)
        peer.send({"type": "conversation.item.create", "text": "one more"})
        done = await peer.wait_event("response.done", timeout=30, after=n)
        assert done["status"] == "completed"
        assert server.proc.poll() is None  # still here for it
    finally:
        await peer.close()  # the last session ends: the host exits by itself
    assert server.proc is not None
    code = await asyncio.to_thread(server.proc.wait, within(30))
    assert code == 0
    log = server.log()
    assert "draining: no new sessions; 1 live" in log and "drained: no session left" in log


async def test_the_drain_ends_at_its_deadline_and_a_second_sigterm_ends_it_at_once(
    client_ice: None,
) -> None:
    for second_signal in (False, True):
        server = draining_server(3 if not second_signal else 600)
        peer = Peer(server.url, video=False)
        try:
            await peer.connect()
            assert server.proc is not None
            started = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await until_draining(server)
            if second_signal:
                server.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(server.proc.wait, within(60))
            waited = time.monotonic() - started
        finally:
            await peer.close()
        assert code == 0
        log = server.log()
        if second_signal:
            assert "drain cut short" in log and waited < 60  # not the 600 s deadline
        else:
            assert "drain deadline: 1 sessions still live" in log and waited >= 3


async def test_a_supervisor_drains_its_workers_and_keeps_routing_to_their_sessions() -> None:
    """``--workers``: the first SIGTERM drains through the router, which refuses new sessions
    but still sends each live session's requests to its worker; the workers exit when their
    sessions have ended, and then the supervisor."""
    settings = {
        "pipeline.factory": TONE_PIPELINE,
        "server.workers": "2",
        "server.drain_timeout_s": "120",
        "transport.video": "false",
        # the trickle offers never connect: their sessions live until deleted
        "transport.connect_timeout_s": "300",
        "transport.ice_connect_timeout_s": "300",
    }
    server = ServerProcess(settings, env=tone_env(500, sentences=1)).start(timeout=120)
    sdp = {"Content-Type": "application/sdp"}
    stale = {"Content-Type": "application/trickle-ice-sdpfrag", "If-Match": '"stale"'}
    try:
        offer = await trickle_offer()
        async with aiohttp.ClientSession() as http:
            ids = []
            for _ in range(2):  # one on each worker (the least loaded takes the next)
                async with http.post(server.url + "/whip", data=offer, headers=sdp) as resp:
                    assert resp.status == 201, await resp.text()
                    ids.append(resp.headers["Location"].removeprefix("/whip/"))
                await server.wait_sessions(len(ids), timeout=10)
            assert sorted(i.split("-")[0] for i in ids) == ["w1", "w2"]
            assert server.proc is not None
            server.proc.send_signal(signal.SIGTERM)
            body = await until_draining(server)
            assert body["sessions"] == 2
            async with http.post(server.url + "/whip", data=offer, headers=sdp) as resp:
                assert resp.status == 503 and (await resp.json())["code"] == "draining"
                assert "Retry-After" in resp.headers
            for session_id in ids:  # still routed to their workers, which still hold them
                url = f"{server.url}/whip/{session_id}"
                async with http.patch(url, data="a=x\r\n", headers=stale) as resp:
                    assert resp.status == 412, await resp.text()
                async with http.delete(url) as resp:
                    assert resp.status == 200
        code = await asyncio.to_thread(server.proc.wait, within(60))
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signal.SIGINT)
        server.stop()
    log = server.log()
    assert code == 0, log[-3000:]
    assert "supervisor: draining 2 workers" in log
    assert log.count("drained: no session left") == 2
    assert "supervisor: every worker has drained" in log
    assert "restarting" not in log  # a drained worker is not restarted
