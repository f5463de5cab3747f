"""Several worker processes behind one port: real supervisor, real workers, real aiortc peers.

The router is also tested alone against two small real HTTP upstreams (header passing, Location
rewriting, placement when a worker is full), and the Prometheus merge against real expositions.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from yarl import URL

from benchmarks.workers_bench import capacity
from client.cli import GA_EVENTS
from server.clock import FakeClock
from server.config import Config, load_config
from server.errors import ConfigError, InvalidTransition
from server.fleet.merge import join_objects, merge_expositions
from server.fleet.router import create_router, worker_of
from server.fleet.worker import Worker, WorkerState
from server.fleet.workers import Supervisor
from server.http.guards import WORKER_KEY_HEADER
from server.metrics import Metrics
from tests.support.pace import within
from tests.support.peers import Peer
from tests.support.server_process import (
    ROOT,
    TONE_PIPELINE,
    ServerProcess,
    free_port,
    metric_value,
    server_process,
    tone_env,
)
from tests.support.speech import loud_seconds

pytestmark = pytest.mark.usefixtures("client_ice")  # tests/conftest.py

SETTINGS = {
    "pipeline.factory": TONE_PIPELINE,
    "server.workers": "2",
    "transport.max_sessions": "2",  # per worker
    "transport.video": "false",
    "server.debug_endpoints": "true",
}


server = server_process(SETTINGS, env=tone_env(1000, sentences=1), exit_code=None)


def by_worker(health: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {w["worker"]: w for w in health["workers"]}


async def sessions_are(server: ServerProcess, counts: dict[int, int]) -> dict[str, Any]:
    return await server.wait_health(
        lambda h: {i: w["sessions"] for i, w in by_worker(h).items()} == counts,
        20,
        f"sessions {counts}",
    )


async def test_sessions_spread_over_workers_each_with_audio_and_events(
    server: ServerProcess, peers: list[Peer]
) -> None:
    await sessions_are(server, {1: 0, 2: 0})
    for whip in (False, True, False, True):
        peer = Peer(server.url, whip=whip, video=False)
        peers.append(peer)
        await peer.connect()
    health = await sessions_are(server, {1: 2, 2: 2})
    assert health["status"] == "ok" and health["sessions"] == 4
    owners = sorted(worker_of(p.session_id or "") or 0 for p in peers)
    assert owners == [1, 1, 2, 2]
    for peer in peers:
        created = await peer.wait_event("session.created")
        assert created["session"]["id"] == peer.session_id  # the worker knows its prefixed id
    # every peer talks to its own worker over its own data channel and hears its reply
    for i, peer in enumerate(peers):
        peer.send({"type": "conversation.item.create", "text": f"hello {i}"})
    for peer in peers:
        created = await peer.wait_event("response.created", timeout=15)
        assert created["epoch"] == 0
        await peer.wait_event("response.done", timeout=15)
    await asyncio.sleep(0.3)
    for peer in peers:
        assert 0.9 <= loud_seconds(peer.received_audio()) <= 1.1  # its 1 s tone reply
    # both workers are full: the router answers 503 JSON with Retry-After
    async with aiohttp.ClientSession() as http:
        offer = {"type": "offer", "sdp": peers[0].pc.localDescription.sdp}
        async with http.post(server.url + "/offer", json=offer) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "5"
            assert (await resp.json())["code"] == "server_full"
    rejected = metric_value(server.metrics(), "avatar_sessions_rejected_total")
    assert rejected == 2  # each worker was asked and refused


async def test_whip_delete_goes_to_the_owning_worker(server: ServerProcess) -> None:
    await sessions_are(server, {1: 0, 2: 0})
    first, second = (Peer(server.url, whip=True, video=False) for _ in range(2))
    for peer in (first, second):
        await peer.connect()
    await sessions_are(server, {1: 1, 2: 1})
    on_2 = next(p for p in (first, second) if (p.location or "").startswith("/whip/w2-"))
    on_1 = first if on_2 is second else second
    async with aiohttp.ClientSession() as http:
        async with http.delete(server.url + (on_2.location or "")) as resp:
            assert resp.status == 200
        await sessions_are(server, {1: 1, 2: 0})  # worker 2 freed it, worker 1 untouched
        async with http.delete(server.url + (on_2.location or "")) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]
        # the session on worker 1 still works
        on_1.send({"type": "conversation.item.create", "text": "still there?"})
        await on_1.wait_event("response.created", timeout=15)
    await on_2.close(delete=False)
    await on_1.close()
    await sessions_are(server, {1: 0, 2: 0})


async def test_realtime_calls_reach_a_worker_and_end_on_their_owner(server: ServerProcess) -> None:
    """``POST /v1/realtime/calls`` is placed like a WHIP offer; its Location routes to the
    worker that holds the call."""
    await sessions_are(server, {1: 0, 2: 0})
    peers = [Peer(server.url, video=False, events_label=GA_EVENTS) for _ in range(2)]
    locations = []
    async with aiohttp.ClientSession() as http:
        for peer in peers:
            peer.pc.addTrack(peer.mic)
            await peer.pc.setLocalDescription(await peer.pc.createOffer())
            body = peer.pc.localDescription.sdp
            headers = {"Content-Type": "application/sdp"}
            async with http.post(
                server.url + "/v1/realtime/calls", data=body, headers=headers
            ) as r:
                assert r.status == 201, await r.text()
                locations.append(r.headers["Location"])
                answer = await r.text()
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await sessions_are(server, {1: 1, 2: 1})
        on_2 = next(loc for loc in locations if loc.startswith("/v1/realtime/calls/w2-"))
        async with http.delete(server.url + on_2) as resp:
            assert resp.status == 200
        await sessions_are(server, {1: 1, 2: 0})
        async with http.delete(server.url + on_2) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "invalid_request_error"
        on_1 = next(loc for loc in locations if loc != on_2)
        async with http.options(server.url + on_1) as resp:
            assert resp.status < 500
        async with http.post(server.url + on_1 + "/hangup") as resp:
            assert resp.status == 200
        async with http.post(server.url + on_1 + "/hangup") as resp:
            assert resp.status == 404  # a failed hang-up is logged too
    await sessions_are(server, {1: 0, 2: 0})
    for peer in peers:
        await peer.close(delete=False)
    # SECURITY.md: the access log held whole call ids (DELETE, hangup, OPTIONS; failed ones
    # too); without tokens the id is the only credential of the call
    log = server.log()
    for location in locations:
        call_id = location.rsplit("/", 1)[-1]
        assert f"/v1/realtime/calls/{call_id[:8]}…" in log
        assert call_id not in log


async def test_router_answers_errors_as_json(server: ServerProcess) -> None:
    big = "v=0\r\n" + "a=x\r\n" * 20_000
    async with aiohttp.ClientSession() as http:
        cases: list[tuple[str, str, dict[str, Any], int, str]] = [
            ("delete", "/whip/w9-no-such-worker", {}, 404, "not_found"),
            ("delete", "/whip/not-a-session", {}, 404, "not_found"),
            ("delete", "/whip/w2-not-a-session", {}, 404, "not_found"),  # the worker's 404
            ("post", "/offer", {"json": {"type": "offer", "sdp": "hello"}}, 400, "bad_request"),
            (
                "post",
                "/whip",
                {"data": "v=0", "headers": {"Content-Type": "application/json"}},
                415,
                "unsupported_media_type",
            ),
            (
                "post",
                "/whip",
                {"data": big, "headers": {"Content-Type": "application/sdp"}},
                413,
                "payload_too_large",
            ),
        ]
        for method, path, kwargs, status, code in cases:
            async with http.request(method, server.url + path, **kwargs) as resp:
                assert resp.status == status, (path, await resp.text())
                assert (await resp.json())["code"] == code, path
        async with http.get(server.url + "/") as resp:  # the page, from a worker
            assert resp.status == 200
            assert "html" in resp.content_type
    health = await sessions_are(server, {1: 0, 2: 0})
    assert health["sessions"] == 0


async def test_metrics_and_debug_cover_every_worker(server: ServerProcess) -> None:
    await sessions_are(server, {1: 0, 2: 0})
    peers = [Peer(server.url, whip=True, video=False) for _ in range(2)]
    for peer in peers:  # one session on each worker, then gone
        await peer.connect()
    await sessions_are(server, {1: 1, 2: 1})
    text = server.metrics()
    for peer in peers:
        await peer.close()
    for index in (1, 2):
        assert f'avatar_sessions_active{{worker="{index}"}} 1.0' in text
        assert f'avatar_worker_up{{worker="{index}"}} 1' in text
    assert text.count("# TYPE avatar_sessions_active gauge") == 1  # one family, two workers
    assert metric_value(text, "avatar_sessions_active") == 2
    await sessions_are(server, {1: 0, 2: 0})
    async with (
        aiohttp.ClientSession() as http,
        http.get(server.url + "/debug/sessions") as resp,
    ):
        assert resp.status == 200
        data = await resp.json()
    ids = {entry["session_id"][:3] for entry in data["closed"]}
    assert ids == {"w1-", "w2-"}
    assert data["tasks"]["SessionRegistry._reap_loop"] == 2  # each worker's census, summed


async def test_dead_worker_is_reported_and_restarted(server: ServerProcess) -> None:
    await sessions_are(server, {1: 0, 2: 0})
    peers = [Peer(server.url, whip=True, video=False) for _ in range(2)]
    for peer in peers:
        await peer.connect()
    await sessions_are(server, {1: 1, 2: 1})
    pids_before = server.worker_pids()
    on_2 = next(p for p in peers if (p.location or "").startswith("/whip/w2-"))
    on_1 = next(p for p in peers if p is not on_2)
    os.kill(pids_before[2], signal.SIGKILL)
    after = by_worker(
        await server.wait_health(
            lambda h: by_worker(h)[2]["restarts"] == 1 and by_worker(h)[2]["state"] == "ready",
            20,
            "worker 2 restarted",
        )
    )
    pids_after = server.worker_pids()
    assert pids_after[2] != pids_before[2]
    assert after[2]["last_exit_code"] == -signal.SIGKILL
    assert pids_after[1] == pids_before[1] and after[1]["restarts"] == 0
    assert f"worker 2 (pid {pids_before[2]}) exited with code -9" in server.log()
    assert "pid" not in after[2] and "port" not in after[2]  # /healthz is public
    assert metric_value(server.metrics(), "avatar_worker_restarts_total") == 1
    # its sessions died with it; worker 1's session never noticed
    async with (
        aiohttp.ClientSession() as http,
        http.delete(server.url + (on_2.location or "")) as resp,
    ):
        assert resp.status == 404
    on_1.send({"type": "conversation.item.create", "text": "are you still there?"})
    await on_1.wait_event("response.done", timeout=15)
    # the restarted worker takes new sessions
    fresh = Peer(server.url, whip=True, video=False)
    await fresh.connect()
    assert (fresh.location or "").startswith("/whip/w2-")
    fresh.send({"type": "conversation.item.create", "text": "hello new worker"})
    await fresh.wait_event("response.done", timeout=15)
    for peer in (fresh, on_1):
        await peer.close()
    await on_2.close(delete=False)
    # the access log names the session by the first 8 characters of its id, never all of it
    assert on_2.location and f"DELETE {on_2.location[:14]}… HTTP" in server.log()
    assert on_2.location not in server.log()


async def test_a_hung_worker_is_reported_and_gets_no_new_sessions(server: ServerProcess) -> None:
    await sessions_are(server, {1: 0, 2: 0})
    pid = server.worker_pids()[1]
    os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing
    try:
        health = await server.wait_health(
            lambda h: by_worker(h)[1]["state"] == "unhealthy", 30, "worker 1 unhealthy"
        )
        assert health["status"] == "degraded"
        assert 'avatar_worker_up{worker="1"} 0' in server.metrics()
        peer = Peer(server.url, whip=True, video=False)
        await peer.connect()
        assert (peer.location or "").startswith("/whip/w2-")  # the answering worker took it
    finally:
        os.kill(pid, signal.SIGCONT)
    health = await server.wait_health(lambda h: h["status"] == "ok", 20, "worker 1 ready again")
    assert server.worker_pids()[1] == pid and by_worker(health)[1]["restarts"] == 0
    await peer.close()
    await sessions_are(server, {1: 0, 2: 0})


async def test_shutdown_stops_every_worker(server: ServerProcess) -> None:
    pids = [pid for _, pid in sorted(server.worker_pids().items())]
    assert len(pids) == 2
    assert server.stop() == 0, server.log()
    log = server.log()
    assert "shutting down: router first, then the workers" in log
    assert log.index("shutting down: router first") < log.index("[w1] server: shutting down")
    for index, pid in enumerate(pids, start=1):
        assert f"worker {index} (pid {pid}) exited with code 0" in log
        assert not Path(f"/proc/{pid}").exists()  # exited and reaped
    assert log.count("all sessions closed") == 2  # each worker's own ordered shutdown


# ----- the router alone, against two small real upstreams


@dataclass
class Upstream:
    """A worker as the router sees it, here a small echo app on a loopback port."""

    index: int
    url: str
    sessions: int = 0
    accepting: bool = True
    alive: bool = True
    restarts: int = 0

    def placed(self) -> None:
        self.sessions += 1

    def describe(self) -> dict[str, Any]:
        return {"worker": self.index, "sessions": self.sessions, "tasks": 1}


@dataclass
class StaticPool:
    workers: Sequence[Upstream]
    draining: bool = False

    async def poll(self) -> None:
        return None


def echo_app(index: int, full: bool) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        if request.method == "POST" and full:
            full_body = {"error": "full", "code": "server_full"}
            return web.json_response(full_body, status=503, headers={"Retry-After": "7"})
        sid = f"w{index}-abc"
        headers = {
            "Location": f"http://127.0.0.1:{request.url.port}/whip/{sid}"
            if request.query.get("absolute")
            else f"/whip/{sid}",
            "ETag": '"v1"',
            "Access-Control-Allow-Origin": "*",
        }
        body: dict[str, Any] = {
            "worker": index,
            "method": request.method,
            "path": request.path_qs,
            "host": request.host,
            "authorization": request.headers.get("Authorization"),
            "if_match": request.headers.get("If-Match"),
            "forwarded_for": request.headers.get("X-Forwarded-For"),
            "content_type": request.headers.get("Content-Type"),
            "body": (await request.read()).decode(),
        }
        resp = web.json_response(body, status=201 if request.method == "POST" else 200)
        resp.headers.extend(headers)
        resp.headers.add("Link", "<stun:a.example>; rel=ice-server")
        resp.headers.add("Link", "<stun:b.example>; rel=ice-server")
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def router_with_echoes() -> AsyncIterator[tuple[str, list[Upstream]]]:
    runners = []
    workers = []
    for index, full in ((1, True), (2, False)):
        runner, url = await serve_app(echo_app(index, full))
        runners.append(runner)
        workers.append(Upstream(index, url))
    config = load_config(overrides={"transport.max_body_bytes": "2048"})
    runner, url = await serve_app(create_router(config, StaticPool(workers)))
    runners.append(runner)
    yield url, workers
    for r in runners:
        await r.cleanup()


async def test_router_passes_headers_and_skips_a_full_worker(
    router_with_echoes: tuple[str, list[Upstream]],
) -> None:
    url, workers = router_with_echoes
    headers = {
        "Authorization": "Bearer t0k",
        "Content-Type": "application/sdp",
        "X-Forwarded-For": "6.6.6.6",  # not from a trusted proxy: replaced by the peer's address
    }
    async with aiohttp.ClientSession() as http:
        # worker 1 is least loaded but full (503): the offer lands on worker 2
        async with http.post(url + "/whip?x=1", data="v=0", headers=headers) as resp:
            assert resp.status == 201
            echo = await resp.json()
            assert echo["worker"] == 2 and echo["path"] == "/whip?x=1"
            assert echo["authorization"] == "Bearer t0k"
            assert echo["forwarded_for"] == "127.0.0.1"  # the client alone, as the router saw it
            assert echo["content_type"] == "application/sdp" and echo["body"] == "v=0"
            assert echo["host"] == url.removeprefix("http://")  # the public host, kept
            assert resp.headers["Location"] == "/whip/w2-abc"
            assert resp.headers["ETag"] == '"v1"'
            assert resp.headers.getall("Link") == [
                "<stun:a.example>; rel=ice-server",
                "<stun:b.example>; rel=ice-server",
            ]
            assert resp.headers["Access-Control-Allow-Origin"] == "*"
        assert [w.sessions for w in workers] == [0, 1]
        # a session's requests go to its worker, whatever the load
        patch = {"If-Match": '"v1"', "Content-Type": "application/trickle-ice-sdpfrag"}
        async with http.patch(url + "/whip/w1-abc?absolute=1", data="a=x", headers=patch) as resp:
            echo = await resp.json()
            assert echo["worker"] == 1 and echo["method"] == "PATCH"
            assert echo["if_match"] == '"v1"' and echo["body"] == "a=x"
            assert resp.headers["Location"] == f"{url}/whip/w1-abc"  # rewritten to the router
        async with http.options(url + "/whip") as resp:
            assert (await resp.json())["method"] == "OPTIONS"
        # every worker full: the worker's own 503 comes back
        workers[1].accepting = False
        async with http.post(url + "/offer", json={}) as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "7"
        workers[0].accepting = False
        async with http.post(url + "/offer", json={}) as resp:
            assert resp.status == 503 and (await resp.json())["error"] == "no worker is ready"
        async with http.post(url + "/whip", data="x" * 4096, headers=headers) as resp:
            assert resp.status == 413 and (await resp.json())["code"] == "payload_too_large"


async def test_dot_segments_cannot_skip_the_routers_rate_limit() -> None:
    """``POST /./offer`` and the like once reached a worker as ``POST /offer`` past the limit:
    the router routed the raw path and its client normalised it on the way."""
    seen: list[str] = []
    keys: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.raw_path}")
        keys.append(request.headers.get(WORKER_KEY_HEADER, ""))
        return web.json_response({}, status=201)

    upstream = web.Application()
    upstream.router.add_route("*", "/{tail:.*}", record)
    worker_runner, worker_url = await serve_app(upstream)
    config = load_config(
        overrides={"transport.session_rate_per_min": "1", "transport.session_burst": "1"}
    )
    runner, url = await serve_app(
        create_router(config, StaticPool([Upstream(1, worker_url)]), "k" * 32)
    )
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/offer", json={}) as resp:
                assert resp.status == 201
            async with http.post(url + "/offer", json={}) as resp:
                assert resp.status == 429  # this address is over its limit
            for path in (
                "/./offer",
                "/static/../offer",
                "/whip/x/../../offer",
                "/%2e/offer",
                "/whip/%2E%2E/offer",
                "/whip/x/..%2f..%2foffer",
            ):
                # encoded=True: the client sends the path exactly as written
                async with http.post(URL(url + path, encoded=True), json={}) as resp:
                    assert resp.status == 400, path
                    assert (await resp.json())["code"] == "bad_request"
            async with http.get(URL(url + "/static/app.v2.js", encoded=True)) as resp:
                assert resp.status == 201  # a dot inside a name is no segment
        assert seen == ["POST /offer", "GET /static/app.v2.js"]
        assert keys == ["k" * 32] * 2  # the router shows the workers its key
    finally:
        await runner.cleanup()
        await worker_runner.cleanup()


async def test_a_compressed_body_reaches_the_worker_as_it_reaches_one_worker_alone(
    router_with_echoes: tuple[str, list[Upstream]],
) -> None:
    url, workers = router_with_echoes
    offer = json.dumps({"type": "offer", "sdp": "v=0"})
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with aiohttp.ClientSession() as http:
        for target in (workers[1].url, url):  # worker 2 alone, then through the router
            async with http.post(
                target + "/offer", data=gzip.compress(offer.encode()), headers=headers
            ) as resp:
                assert resp.status == 201, await resp.text()
                echo = await resp.json()
                assert echo["worker"] == 2 and echo["body"] == offer


def test_metrics_of_two_workers_merge_into_one_exposition() -> None:
    first, second = Metrics(), Metrics()
    first.sessions_total.inc()
    second.stale_dropped.labels("tts").inc(3)
    text = merge_expositions([("1", first.render().decode()), ("2", second.render().decode())])
    assert text.count("# TYPE avatar_sessions_total counter") == 1
    assert 'avatar_sessions_total{worker="1"} 1.0' in text
    assert 'avatar_sessions_total{worker="2"} 0.0' in text
    assert 'avatar_stale_dropped_total{worker="2",stage="tts"} 3.0' in text
    lines = text.splitlines()
    family = [i for i, line in enumerate(lines) if line.startswith("avatar_sessions_total")]
    assert family == list(range(family[0], family[0] + 2))  # a family's samples stay together


def test_debug_objects_of_two_workers_join_into_one() -> None:
    first = {"live": [1], "closed_total": 2, "tasks": {"a": 1, "b": 2}, "version": "x"}
    second = {"live": [2], "closed_total": 3, "tasks": {"a": 4}, "version": "y"}
    assert join_objects([first, second]) == {
        "live": [1, 2],
        "closed_total": 5,
        "tasks": {"a": 5, "b": 2},
        "version": "x",
    }


def test_worker_state_changes_only_along_its_table() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        worker = Worker(1, sock, FakeClock())
        assert worker.state is WorkerState.IDLE and not worker.accepting
        with pytest.raises(InvalidTransition):
            worker.set_state(WorkerState.READY)  # never ready without starting
        worker.set_state(WorkerState.STARTING)
        worker.set_state(WorkerState.READY)
        assert worker.accepting
        worker.set_state(WorkerState.DOWN)
        with pytest.raises(InvalidTransition):
            worker.set_state(WorkerState.READY)  # a restart starts again


async def test_concurrent_polls_ask_each_worker_once() -> None:
    """The poll loop and the router's /healthz may poll at once: they share one question to
    each worker, so a slow worker is not counted failed once per caller."""
    asked = 0

    async def slow_health(request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        await asyncio.sleep(0.3)
        return web.json_response({"status": "starting"}, status=503)

    app = web.Application()
    app.router.add_get("/healthz", slow_health)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    await web.SockSite(runner, sock).start()
    supervisor = Supervisor(load_config(), [])
    worker = Worker(1, sock, FakeClock())
    worker.set_state(WorkerState.STARTING)
    worker.set_state(WorkerState.READY)
    supervisor.workers.append(worker)
    supervisor._http = aiohttp.ClientSession()
    try:
        await asyncio.gather(supervisor.poll(), supervisor.poll(), supervisor.poll())
        assert (asked, worker.failed_polls) == (1, 1)
        await supervisor.poll()  # the next poll asks again
        assert (asked, worker.failed_polls) == (2, 2)
    finally:
        await supervisor._http.close()
        await runner.cleanup()
        sock.close()


hosted = server_process(
    {**SETTINGS, "server.session_id_prefix": "h1.", "session.resume_window_s": "30"},
    env=tone_env(1000, sentences=1),
    exit_code=None,
)


async def test_resumes_reach_the_owner_worker_and_ids_keep_the_host_prefix(
    hosted: ServerProcess,
) -> None:
    """Attack re-run (SECURITY.md): behind --workers every resume got 404 (6 of 6: the router
    placed it on the least-loaded worker) and the host prefix was replaced (``h1.`` ->
    ``w1-``), so a proxy in front could not route by host."""
    peers = [Peer(hosted.url, whip=whip, video=False) for whip in (False, True, False)]
    try:
        for peer in peers:
            await peer.connect()
            await peer.wait_event("session.created")
        assert all((p.session_id or "").startswith(("h1.w1-", "h1.w2-")) for p in peers)
        owners = [worker_of(p.session_id or "", "h1.") or 0 for p in peers]
        assert sorted(owners) in ([1, 1, 2], [1, 2, 2])
        resumed = 0
        for _ in range(2):  # each resumes twice: /offer's body and WHIP's header
            for peer in peers:
                await peer.resume()
                created = await peer.wait_event("session.created", where=lambda e: e["resumed"])
                assert created["session"]["id"] == peer.session_id
                resumed += 1
        assert resumed == 6
        async with aiohttp.ClientSession() as http:
            # a resume token that names no worker of this host: 404, nothing placed
            token = {"Avatar-Resume-Token": "h1.w9-" + "A" * 32 + "." + "B" * 32}
            sdp = {"Content-Type": "application/sdp"}
            async with http.post(hosted.url + "/whip", data="v=0", headers={**token, **sdp}) as r:
                assert r.status == 404
        await sessions_are(hosted, {1: owners.count(1), 2: owners.count(2)})
    finally:
        for peer in peers:
            await peer.close()
    await sessions_are(hosted, {1: 0, 2: 0})


def test_session_id_prefix_setting() -> None:
    config: Config = load_config(overrides={"server.session_id_prefix": "w3-"})
    assert config.server.session_id_prefix == "w3-" and worker_of("w3-abc") == 3
    assert worker_of("abc") is None
    assert worker_of("h1.w3-abc", "h1.") == 3 and worker_of("h2.w3-abc", "h1.") is None
    with pytest.raises(ConfigError, match=r"server\.session_id_prefix"):
        load_config(overrides={"server.session_id_prefix": "a/b"})
    with pytest.raises(ConfigError, match=r"server\.workers"):
        load_config(overrides={"server.workers": "0"})


def test_a_worker_that_cannot_start_stops_the_supervisor() -> None:
    args = ["--port", str(free_port()), "--workers", "2"]
    args += ["--set", "pipeline.factory=tests.support.no_such_module:create"]
    proc = subprocess.run(
        [sys.executable, "-m", "server", *args],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stderr
    assert "workers did not become ready (worker 1: exit code 2" in proc.stderr
    assert "ready: listening" not in proc.stderr


async def test_tokens_etags_origins_and_rate_limit_work_through_the_router() -> None:
    token = "a-bearer-token-for-the-test"
    server = ServerProcess(
        {
            **SETTINGS,
            "server.auth_tokens": token,
            "transport.session_burst": "3",  # per client address, for all workers together
            "transport.session_rate_per_min": "1",
        }
    ).start()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("events")
    pc.addTransceiver("audio")
    await pc.setLocalDescription(await pc.createOffer())
    offer = pc.localDescription.sdp
    auth = {"Authorization": f"Bearer {token}"}
    sdp = {"Content-Type": "application/sdp"}
    url = server.url
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/whip", data=offer, headers=sdp) as resp:
                assert resp.status == 401  # the worker's answer, its header too
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            async with http.post(url + "/whip", data=offer, headers={**auth, **sdp}) as resp:
                assert resp.status == 201, await resp.text()
                location, etag = resp.headers["Location"], resp.headers["ETag"]
            assert worker_of(location.removeprefix("/whip/")) in (1, 2)
            async with http.options(url + location) as resp:  # to the owner
                assert resp.status == 204 and "PATCH" in resp.headers["Allow"]
            frag = {"Content-Type": "application/trickle-ice-sdpfrag"}
            stale = {**auth, **frag, "If-Match": '"stale"'}
            async with http.patch(url + location, data="a=x\r\n", headers=stale) as resp:
                assert resp.status == 412  # If-Match reached the owner and was checked there
                assert etag in (await resp.json())["error"]
            async with http.delete(url + location) as resp:
                assert resp.status == 401
            async with http.get(url + "/debug/sessions") as resp:
                assert resp.status == 401
            async with http.get(url + "/debug/sessions", headers=auth) as resp:
                live = (await resp.json())["live"]
                assert [s["session_id"] for s in live] == [location.removeprefix("/whip/")]
            # the same origin as the public address (Host kept through the router) may call
            preflight = {"Origin": url, "Access-Control-Request-Method": "POST"}
            async with http.options(url + "/whip", headers=preflight) as resp:
                assert resp.status == 204
                assert resp.headers["Access-Control-Allow-Origin"] == url
            elsewhere = {**preflight, "Origin": "http://elsewhere.example"}
            async with http.options(url + "/whip", headers=elsewhere) as resp:
                assert resp.status == 403 and "Access-Control-Allow-Origin" not in resp.headers
            # third and fourth session requests from this address: the burst of 3 is shared
            async with http.post(url + "/whip", data="garbage", headers={**auth, **sdp}) as resp:
                assert resp.status == 400
            spoofed = {**auth, **sdp, "X-Forwarded-For": "198.51.100.7"}
            async with http.post(url + "/whip", data=offer, headers=spoofed) as resp:
                assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
                assert (await resp.json())["code"] == "rate_limited"
            async with http.delete(url + location, headers=auth) as resp:
                assert resp.status == 200
    finally:
        await pc.close()
        assert server.stop() == 0, server.log()


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting for a parent that reaps)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_workers_stop_when_the_supervisor_is_killed() -> None:
    server = ServerProcess(SETTINGS).start()
    pids = [pid for _, pid in sorted(server.worker_pids().items())]
    assert len(pids) == 2
    assert server.proc is not None
    server.proc.kill()  # no chance to stop them: each worker asked for SIGTERM on its own
    server.proc.wait()
    deadline = time.monotonic() + within(20)
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert all(gone(pid) for pid in pids)
    assert server.log().count("all sessions closed") == 2  # a graceful shutdown, each
    server.stop()


def test_capacity_is_the_largest_step_with_every_smaller_one_passing() -> None:
    def result(n: int, p99: float | None, underruns: int = 0, errors: int = 0) -> dict[str, Any]:
        return {
            "sessions": n,
            "frame_lateness_p99_ms": p99,
            "underruns": underruns,
            "errors": ["x"] * errors,
        }

    steps = [result(2, 3.0), result(4, 30.0), result(6, 4.0), result(8, 90.0)]
    assert capacity(steps, 5.0) == 2  # 6 passed 5 ms, but 4 did not
    assert capacity(steps, 40.0) == 6
    assert capacity([result(2, 1.0, underruns=1)], 40.0) == 0
    assert capacity([result(2, 1.0, errors=1)], 40.0) == 0
    assert capacity([result(2, None)], 40.0) == 0
