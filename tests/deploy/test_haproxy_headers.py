"""What the shipped HAProxy configuration (deploy/haproxy/haproxy.cfg) passes on and where it
steers, with Debian's real haproxy in front of three small HTTP upstreams that answer who they
are and the X-Forwarded-For lines they got. Two attacks of SECURITY.md re-run here:

- a client that writes its own ``X-Forwarded-For`` chose its address (``option forwardfor``
  appended the proxy's line after the client's, and the server read the first one);
- an ``Avatar-Resume-Token`` (or a second ``resume_token`` in an ``/offer`` body) steered a
  *new* session to the host it named, past health, weight and maintenance.

The client connects from 127.0.0.7 (every 127/8 address is this namespace's loopback), the proxy
reaches the upstreams from 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from server.http.forwarded import TrustedProxies
from tests.support.server_process import ROOT, free_port, terminate

CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
CLIENT = "127.0.0.7"
PROXY = TrustedProxies.parse(["127.0.0.1"])  # what the hosts are told to trust
HOSTS = ("h1", "h2", "h3")
TOKEN_OF_H2 = "h2." + "A" * 32 + "." + "B" * 32  # the servers' shape: "<id>.<secret>"
OFFER = {"type": "offer", "sdp": "v=0"}

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None and not os.path.exists("/usr/sbin/haproxy"),
    reason="haproxy is not installed (scripts/setup.sh installs it)",
)


async def upstream(name: str) -> web.AppRunner:
    """An HTTP server on loopback that answers every request with its name and headers."""

    async def answer(request: web.Request) -> web.Response:
        lines = request.headers.getall("X-Forwarded-For", [])
        client = PROXY.client(request.remote or "", lines)
        return web.json_response({"host": name, "forwarded": lines, "client": client})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    return runner


@pytest.fixture
async def proxy() -> AsyncIterator[str]:
    """haproxy with the shipped configuration, its three hosts up; its URL."""
    runners = [await upstream(name) for name in HOSTS]
    env = {**os.environ}
    port = free_port()
    env["AVATAR_PROXY_BIND"] = f"127.0.0.1:{port}"
    for name, runner in zip(HOSTS, runners, strict=True):
        host_port = free_port()
        await web.TCPSite(runner, "127.0.0.1", host_port).start()
        env[f"AVATAR_{name.upper()}"] = f"127.0.0.1:{host_port}"
        env[f"AVATAR_{name.upper()}_AGENT"] = str(free_port())  # no agent: weight stays 100
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    proc = subprocess.Popen(
        [haproxy, "-db", "-f", str(CONFIG)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):  # listening, every host past its first check (inter 1 s)
                try:
                    hosts = {(await send(http, url, "GET", "/healthz"))["host"] for _ in HOSTS}
                except aiohttp.ClientConnectionError:
                    hosts = set()
                if hosts == set(HOSTS):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("haproxy did not bring its three hosts up")
        yield url
    finally:
        terminate(proc, 5)
        for runner in runners:
            await runner.cleanup()


async def send(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    path: str,
    headers: CIMultiDict[str] | None = None,
    body: str | None = None,
) -> dict[str, Any]:
    """One request from CLIENT through the proxy; the upstream's answer (or the status)."""
    connector = aiohttp.TCPConnector(local_addr=(CLIENT, 0), force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as own,
        own.request(method, url + path, headers=headers, data=body) as resp,
    ):
        if resp.status != 200:
            return {"host": None, "status": resp.status}
        answer: dict[str, Any] = await resp.json()
        return answer


async def test_the_client_cannot_write_its_own_address(proxy: str) -> None:
    async with aiohttp.ClientSession() as http:
        for forged in ("127.0.0.1", "203.0.113.9, 127.0.0.1", "unknown"):
            headers = CIMultiDict([("X-Forwarded-For", forged), ("X-Forwarded-For", "10.0.0.1")])
            got = await send(http, proxy, "POST", "/whip", headers, "v=0")
            assert got["forwarded"] == [CLIENT]  # replaced: one line, the proxy's own
            assert got["client"] == CLIENT


async def test_only_a_resume_of_the_servers_shape_steers(proxy: str) -> None:
    async def hosts(method: str, path: str, headers: list[tuple[str, str]], body: str) -> set[str]:
        """Where three such requests in a row go (round robin: three hosts unless steered)."""
        async with aiohttp.ClientSession() as http:
            return {
                (await send(http, proxy, method, path, CIMultiDict(headers), body))["host"]
                for _ in range(3)
            }

    token = [("Avatar-Resume-Token", TOKEN_OF_H2)]
    # a real resume goes to its host, by header (/offer, /whip) or by /offer's body
    assert await hosts("POST", "/whip", token, "v=0") == {"h2"}
    assert await hosts("POST", "/offer", token, json.dumps(OFFER)) == {"h2"}
    in_body = json.dumps({**OFFER, "resume_token": TOKEN_OF_H2})
    assert await hosts("POST", "/offer", [], in_body) == {"h2"}
    # anything else is a new session, placed by the balancer
    assert await hosts("POST", "/v1/realtime/calls", token, "v=0") == set(HOSTS)
    assert await hosts("POST", "/whip", [("Avatar-Resume-Token", "h2.x")], "v=0") == set(HOSTS)
    assert await hosts("POST", "/whip", token * 2, "v=0") == set(HOSTS)
    assert await hosts("GET", "/", token, "") == set(HOSTS)
    made_up = json.dumps({**OFFER, "resume_token": "h2.not-a-token"})
    assert await hosts("POST", "/offer", [], made_up) == set(HOSTS)
