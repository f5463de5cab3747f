"""Several hosts behind the shipped HAProxy configuration (deploy/haproxy/haproxy.cfg), with
Debian's real haproxy: three server processes (the tone pipeline), each with its own session
id prefix and load-balancer agent, on loopback ports.

New sessions spread over the hosts; every session-scoped request reaches the host that owns
the session (a stale ``If-Match`` answered 412 by it, where any other host would answer 404);
a draining host gets no new session but still serves its own; a killed host's new sessions go
elsewhere within one health interval. (Hosts in their own network namespaces, and media
through coturn, are not part of this test.)"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import signal
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from server.http.agent import agent_line
from tests.support.offers import trickle_offer
from tests.support.pace import within
from tests.support.server_process import ROOT, TONE_PIPELINE, ServerProcess, free_port, tone_env

CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
HOSTS = ("h1", "h2", "h3")
SDP = {"Content-Type": "application/sdp"}
STALE = {"Content-Type": "application/trickle-ice-sdpfrag", "If-Match": '"stale"'}


def test_the_agent_line() -> None:
    assert agent_line(0, 4, False) == "up 100%\n"
    assert agent_line(3, 4, False) == "up 25%\n"
    assert agent_line(4, 4, False) == "up 0%\n"
    assert agent_line(9, 4, False) == "up 0%\n"
    assert agent_line(1, 4, True) == "drain\n"


class Fleet:
    """Three hosts and the proxy in front of them."""

    def __init__(self) -> None:
        self.hosts: dict[str, ServerProcess] = {}
        self.agents: dict[str, int] = {}
        self.proxy: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        for name in HOSTS:
            self.agents[name] = free_port()
            settings = {
                "pipeline.factory": TONE_PIPELINE,
                "server.session_id_prefix": f"{name}.",
                "server.agent_port": str(self.agents[name]),
                "server.drain_timeout_s": "120",
                "transport.max_sessions": "16",
                "transport.max_sessions_per_client": "64",
                # the trickle offers never connect: their sessions live for the whole test
                "transport.connect_timeout_s": "300",
                "transport.ice_connect_timeout_s": "300",
                "transport.video": "false",
            }
            self.hosts[name] = ServerProcess(settings, env=tone_env(500, sentences=1)).start(
                timeout=60
            )
        port = free_port()
        env = {**os.environ, "AVATAR_PROXY_BIND": f"127.0.0.1:{port}"}
        for name, host in self.hosts.items():
            env[f"AVATAR_{name.upper()}"] = host.url.removeprefix("http://")
            env[f"AVATAR_{name.upper()}_AGENT"] = str(self.agents[name])
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.proxy = subprocess.Popen(  # its log: what it decided, shown when a test fails
            [haproxy, "-db", "-f", str(CONFIG)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self) -> None:
        """Until the proxy answers /healthz through its hosts six times in a row, and every
        host has passed its first checks (inter 1 s)."""
        deadline, answered = time.monotonic() + within(30), 0
        while answered < 6:
            assert time.monotonic() < deadline, "the proxy never answered through its hosts"
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    answered = answered + 1 if resp.status == 200 else 0
            except (OSError, urllib.error.URLError):
                answered = 0
                time.sleep(0.1)
        time.sleep(2.5)

    def stop(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            out, _ = self.proxy.communicate(timeout=10)
            print("haproxy's log (its end):\n" + out[-3000:])  # shown when a test failed
        for host in self.hosts.values():
            if host.proc is not None and host.proc.poll() is None:
                host.proc.send_signal(signal.SIGINT)  # at once, not a drain
            host.stop()


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    if shutil.which("haproxy") is None and not os.path.exists("/usr/sbin/haproxy"):
        pytest.fail("haproxy is required (scripts/setup.sh installs it)")
    fleet = Fleet()
    try:
        fleet.start()
        fleet.wait_ready()
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def until(check: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + within(timeout_s)
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.1)


async def open_sessions(
    http: aiohttp.ClientSession, url: str, offer: str, n: int, took_ms: list[float] | None = None
) -> list[str]:
    """``n`` new sessions through ``url``, one every 100 ms (users arrive over time; the
    agents' weights follow each host's load once a second); each offer's time to its answer
    goes to ``took_ms``."""
    ids = []
    for k in range(n):
        if k:
            await asyncio.sleep(0.1)
        started = time.perf_counter()
        async with http.post(url + "/whip", data=offer, headers=SDP) as resp:
            assert resp.status == 201, await resp.text()
            ids.append(resp.headers["Location"].removeprefix("/whip/"))
        if took_ms is not None:
            took_ms.append((time.perf_counter() - started) * 1000)
    return ids


async def sessions_of(http: aiohttp.ClientSession, host: ServerProcess) -> int:
    async with http.get(host.url + "/healthz") as resp:
        return int((await resp.json())["sessions"])


async def test_sessions_spread_and_their_requests_reach_their_host(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    offer = await trickle_offer()
    proxied: list[float] = []
    ids = await open_sessions(http, fleet.url, offer, 30, proxied)
    spread = collections.Counter(i.split(".")[0] for i in ids)
    assert set(spread) == set(HOSTS) and all(8 <= n <= 12 for n in spread.values()), spread
    for name, host in fleet.hosts.items():
        assert await sessions_of(http, host) == spread[name]
    # PATCH: a stale If-Match is checked by the owner (412); any other host knows no such
    # session (404). DELETE ends it there.
    for session_id in ids:
        async with http.patch(f"{fleet.url}/whip/{session_id}", data="a=x\r\n", headers=STALE) as r:
            assert r.status == 412, (session_id, r.status, await r.text())
        async with http.delete(f"{fleet.url}/whip/{session_id}") as resp:
            assert resp.status == 200, (session_id, resp.status)
    for host in fleet.hosts.values():
        assert await sessions_of(http, host) == 0
    direct: list[float] = []  # the same offers straight to a host, for comparison
    alone = await open_sessions(http, fleet.hosts["h1"].url, offer, 10, direct)
    for session_id in alone:
        async with http.delete(f"{fleet.hosts['h1'].url}/whip/{session_id}") as resp:
            assert resp.status == 200
    print(
        f"\nan offer to its answer (p50): {statistics.median(proxied):.1f} ms through the proxy"
        f" (30), {statistics.median(direct):.1f} ms straight to a host (10)"
    )
    # an unknown session is not found, whether its prefix names a host or not
    for unknown in ("h1.nothing", "h9.nothing", "nothing"):
        async with http.delete(f"{fleet.url}/whip/{unknown}") as resp:
            assert resp.status == 404


async def test_a_draining_host_keeps_its_sessions_and_a_killed_one_is_passed_over(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    offer = await trickle_offer()
    ids = await open_sessions(http, fleet.url, offer, 6)
    on_h2 = [i for i in ids if i.startswith("h2.")]
    assert on_h2
    draining = fleet.hosts["h2"]
    assert draining.proc is not None
    draining.proc.send_signal(signal.SIGTERM)  # drains: its sessions stay, new ones go elsewhere
    await asyncio.sleep(within(1.5))  # one health interval (inter 1 s, fall 1)
    more = await open_sessions(http, fleet.url, offer, 6)
    assert not [i for i in more if i.startswith("h2.")], more
    for session_id in on_h2:  # still served by their own host
        async with http.patch(f"{fleet.url}/whip/{session_id}", data="a=x\r\n", headers=STALE) as r:
            assert r.status == 412
        async with http.delete(f"{fleet.url}/whip/{session_id}") as resp:
            assert resp.status == 200
    # its last session ended: it exits by itself
    code = await asyncio.to_thread(draining.proc.wait, within(30))
    assert code == 0 and "drained: no session left" in draining.log()
    # h3 is killed: within one health interval new sessions go to h1 alone
    killed = fleet.hosts["h3"]
    assert killed.proc is not None
    killed.proc.kill()
    killed.proc.wait()
    await asyncio.sleep(within(1.5))
    last = await open_sessions(http, fleet.url, offer, 4)
    assert all(i.startswith("h1.") for i in last), last
    for session_id in [*ids, *more, *last]:
        if session_id.startswith("h1."):
            async with http.delete(f"{fleet.url}/whip/{session_id}") as resp:
                assert resp.status == 200
