"""Draining a host: a SIGTERM (with ``server.drain_timeout_s``) refuses new sessions, answers
/healthz with 503 "draining" so a proxy takes the host out of rotation, lets the live sessions
finish their replies, and exits when the last one has ended or at the deadline. Real server
processes, real aiortc peers, the tone pipeline."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

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
