"""Several media hosts behind the shipped HAProxy configuration (deploy/haproxy/haproxy.cfg) and
coturn, each in its own network namespace, all built by the test:

- three hosts (the tone pipeline), each on a private bridge with its own address
  (10.90.0.1-3), its own session id prefix and its load-balancer agent;
- an edge namespace with Debian's real haproxy and coturn, on that bridge (10.90.0.10) and on
  a public link (10.91.0.10);
- a client namespace on the public link only (10.91.0.2): it reaches the proxy and coturn and
  nothing else, so its media can only go through the hosts' TURN relays;
- the test itself (the operator) on the bridge (10.90.0.254), to look at each host directly.

New sessions spread over the hosts; every session-scoped request reaches the host that owns
the session (a stale ``If-Match`` answered 412, a made-up resume token 403 by it, where any other
host would answer 404);
a draining host gets no new session, its live reply plays out with no underrun and it exits
when empty; a killed host's new sessions go elsewhere within one health interval."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from client.cli import load_wav
from server.http.agent import agent_line
from tests.support.coturn import Coturn
from tests.support.netns import Netns, bridge, cable, interfaces, ip, plug, require_isolated
from tests.support.offers import trickle_offer
from tests.support.pace import within
from tests.support.server_process import (
    ROOT,
    TONE_PIPELINE,
    ServerProcess,
    metric_value,
    tone_env,
)
from tests.support.speech import loud_frames

CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
LAN = "10.90.0"  # the hosts' private network, a bridge
HOSTS = {"h1": f"{LAN}.1", "h2": f"{LAN}.2", "h3": f"{LAN}.3"}
EDGE = f"{LAN}.10"  # the proxy and coturn, on the bridge
OPERATOR = f"{LAN}.254"  # this test
EDGE_PUBLIC = "10.91.0.10"  # the proxy and coturn, on the clients' link
CLIENT = "10.91.0.2"
PORT, AGENT_PORT, TURN_PORT = 8080, 8081, 3478
TURN_SECRET = "shared-by-the-hosts-and-coturn"
REPLY_MS, REPLY_SENTENCES = 1500, 4  # each tone reply: 6 s
SDP = {"Content-Type": "application/sdp"}
STALE = {"Content-Type": "application/trickle-ice-sdpfrag", "If-Match": '"stale"'}


def test_the_agent_line() -> None:
    assert agent_line(0, 4, False) == "up 100%\n"
    assert agent_line(3, 4, False) == "up 25%\n"
    assert agent_line(4, 4, False) == "up 0%\n"
    assert agent_line(9, 4, False) == "up 0%\n"
    assert agent_line(1, 4, True) == "drain\n"


class Fleet:
    """The namespaces, three hosts, the proxy and coturn."""

    def __init__(self) -> None:
        self.spaces: dict[str, Netns] = {}
        self.hosts: dict[str, ServerProcess] = {}
        self.proxy: subprocess.Popen[str] | None = None
        self.coturn: Coturn | None = None
        self.url = f"http://{EDGE}:{PORT}"  # the proxy, as the operator reaches it
        self.public_url = f"http://{EDGE_PUBLIC}:{PORT}"  # as clients do

    def start(self) -> None:
        require_isolated()
        bridge("avlan", f"{OPERATOR}/24")
        for name in ("edge", "client", *HOSTS):
            self.spaces[name] = Netns(name)
        edge = self.spaces["edge"]
        plug(edge, "avlan", f"{EDGE}/24", "aved")
        cable(edge, f"{EDGE_PUBLIC}/24", self.spaces["client"], f"{CLIENT}/24", "avpub")
        self.coturn = Coturn(
            host=EDGE,
            also_listening=(EDGE_PUBLIC,),
            relay_ip=EDGE_PUBLIC,  # relayed candidates are public: the clients reach them
            wrapper=edge.wrapper,
            port=TURN_PORT,
            auth_secret=TURN_SECRET,
        ).start()
        for name, address in HOSTS.items():
            plug(self.spaces[name], "avlan", f"{address}/24", f"av{name}")
        for name, address in HOSTS.items():
            settings = {
                "pipeline.factory": TONE_PIPELINE,
                "server.session_id_prefix": f"{name}.",
                "server.agent_port": str(AGENT_PORT),
                "server.drain_timeout_s": "120",
                "server.trusted_proxies": EDGE,  # haproxy's X-Forwarded-For names the client
                "transport.ice_urls": f"turn:{EDGE}:{TURN_PORT}?transport=udp",
                "transport.ice_auth_secret": TURN_SECRET,
                "transport.max_sessions": "16",
                # one operator opens every session: its address (X-Forwarded-For) is one client
                "transport.max_sessions_per_client": "64",
                "transport.session_rate_per_min": "0",
                # the trickle offers never connect: their sessions live for the whole test
                "transport.connect_timeout_s": "300",
                "transport.ice_connect_timeout_s": "300",
                "transport.video": "false",
            }
            host = ServerProcess(
                settings,
                env=tone_env(REPLY_MS, sentences=REPLY_SENTENCES),
                wrapper=list(self.spaces[name].wrapper),
                host=address,
                port=PORT,
            )
            self.hosts[name] = host.start(timeout=60)
        env = {**os.environ, "AVATAR_PROXY_BIND": f":{PORT}"}  # every address of the edge
        for name, address in HOSTS.items():
            env[f"AVATAR_{name.upper()}"] = f"{address}:{PORT}"
            env[f"AVATAR_{name.upper()}_AGENT"] = str(AGENT_PORT)
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.proxy = subprocess.Popen(  # its log: what it decided, shown when a test fails
            [*edge.wrapper, haproxy, "-db", "-f", str(CONFIG)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

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
        if self.coturn is not None:
            self.coturn.stop()
        for space in self.spaces.values():
            space.close()
        if "avlan" in interfaces():
            ip("link", "del", "avlan")


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


class Caller:
    """``python -m client`` (the command-line WebRTC peer) in the client namespace: it asks one
    typed question through the proxy, stays ``duration_s`` and records what it hears."""

    def __init__(self, fleet: Fleet, wav: Path) -> None:
        self.fleet = fleet
        self.wav = wav
        self.events: list[dict[str, Any]] = []
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, duration_s: float) -> Caller:
        self.proc = await asyncio.create_subprocess_exec(
            *self.fleet.spaces["client"].wrapper,
            sys.executable,
            "-m",
            "client",
            "--url",
            self.fleet.public_url,
            "--whip",
            "--no-video",
            "--no-resume",
            "--text",
            "Tell me a story.",
            "--duration",
            f"{duration_s:.1f}",
            "--record-audio",
            str(self.wav),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return self

    async def event(self, kind: str, timeout_s: float) -> dict[str, Any]:
        """The next event of type ``kind`` this caller printed (the events before it are kept
        in ``events``)."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + within(timeout_s)
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind} within {timeout_s} s: {[e['type'] for e in self.events]}"
            line = await asyncio.wait_for(self.proc.stdout.readline(), left)
            assert line, f"the caller ended before {kind}: {await self.finish()}"
            event = json.loads(line)
            self.events.append(event)
            if event["type"] == kind:
                return dict(event)

    async def finish(self) -> str:
        """Wait for the caller to end by itself; its log (stderr)."""
        assert self.proc is not None
        out, err = await asyncio.wait_for(self.proc.communicate(), within(60))
        for line in out.decode().splitlines():
            self.events.append(json.loads(line))
        assert self.proc.returncode == 0, err.decode()
        return err.decode()


def longest_quiet_ms(pcm: np.ndarray[Any, Any], threshold: float = 300.0) -> tuple[float, float]:
    """(length of the loud span, the longest quiet run inside it), both in ms, over 10 ms
    frames of 48 kHz audio: a reply tone that ran dry shows a quiet run."""
    loud = loud_frames(pcm, threshold, 480)
    if not any(loud):
        return 0.0, 0.0
    first, last = loud.index(True), len(loud) - 1 - loud[::-1].index(True)
    longest = run = 0
    for is_loud in loud[first : last + 1]:
        run = 0 if is_loud else run + 1
        longest = max(longest, run)
    return (last - first + 1) * 10.0, longest * 10.0


def test_clients_reach_the_edge_and_nothing_else(fleet: Fleet) -> None:
    """The client namespace reaches the proxy; a host's own address is not even routable."""
    client = fleet.spaces["client"].wrapper
    probe = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"
    reached = subprocess.run([*client, sys.executable, "-c", probe, EDGE_PUBLIC, str(PORT)])
    assert reached.returncode == 0
    refused = subprocess.run(
        [*client, sys.executable, "-c", probe, HOSTS["h1"], str(PORT)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "Network is unreachable" in refused.stderr
    with socket.create_connection((HOSTS["h1"], PORT), 3):  # the operator reaches every host
        pass


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
    # a resume with a made-up secret (of a real one's shape: only those steer) is refused by
    # the owner (403); any other host knows no such session (404): through /offer with the
    # token in its body, and with the header
    for session_id in ids[:6]:
        token = f"{session_id}.{'N' * 32}"
        body = {"type": "offer", "sdp": offer, "resume_token": token}
        async with http.post(f"{fleet.url}/offer", json=body) as resp:
            assert resp.status == 403, (session_id, resp.status, await resp.text())
        header = {**SDP, "Avatar-Resume-Token": token}
        async with http.post(f"{fleet.url}/whip", data=offer, headers=header) as resp:
            assert resp.status == 403, (session_id, resp.status, await resp.text())
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
        f"\n30 sessions spread {'/'.join(str(spread[h]) for h in HOSTS)}; an offer to its answer"
        f" (p50): {statistics.median(proxied):.1f} ms through the proxy (30),"
        f" {statistics.median(direct):.1f} ms straight to a host (10)"
    )
    # an unknown session is not found, whether its prefix names a host or not
    for unknown in ("h1.nothing", "h9.nothing", "nothing"):
        async with http.delete(f"{fleet.url}/whip/{unknown}") as resp:
            assert resp.status == 404


async def test_a_draining_host_plays_out_its_reply_and_a_killed_one_is_passed_over(
    fleet: Fleet, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    offer = await trickle_offer()
    # a caller through the proxy, its media through coturn; its host is drained mid-reply
    caller = await Caller(fleet, tmp_path / "heard.wav").start(duration_s=within(20))
    created = await caller.event("session.created", timeout_s=30)
    owner = str(created["session"]["id"]).split(".")[0]
    draining = fleet.hosts[owner]
    await caller.event("output_audio_buffer.started", timeout_s=20)
    ids = await open_sessions(http, fleet.url, offer, 6)  # some of them on the same host
    assert draining.proc is not None
    draining.proc.send_signal(signal.SIGTERM)  # drains: its sessions stay, new ones go elsewhere
    await asyncio.sleep(within(1.5))  # one health interval (inter 1 s, fall 1)
    more = await open_sessions(http, fleet.url, offer, 6)
    assert not [i for i in more if i.startswith(f"{owner}.")], more
    done = await caller.event("response.done", timeout_s=30)
    assert done["response"]["status"] == "completed", done
    underruns = metric_value(await asyncio.to_thread(draining.metrics), "avatar_playback_underruns")
    assert underruns == 0, draining.log()[-3000:]
    for session_id in ids:  # the drained host still serves its own
        async with http.patch(f"{fleet.url}/whip/{session_id}", data="a=x\r\n", headers=STALE) as r:
            assert r.status == 412
        async with http.delete(f"{fleet.url}/whip/{session_id}") as resp:
            assert resp.status == 200
    # the caller hung up (its WHIP DELETE through the proxy): the host's last session ended,
    # and it exits by itself
    await caller.finish()
    code = await asyncio.to_thread(draining.proc.wait, within(30))
    assert code == 0 and "drained: no session left" in draining.log()
    # what the caller heard: the whole reply, with no hole in it
    loud_ms, quiet_ms = longest_quiet_ms(load_wav(caller.wav))
    expected_ms = REPLY_MS * REPLY_SENTENCES
    assert abs(loud_ms - expected_ms) <= 300 and quiet_ms <= 40, (loud_ms, quiet_ms)
    turn_log = fleet.coturn.log() if fleet.coturn else ""
    assert "ALLOCATE processed, success" in turn_log and "CHANNEL_BIND processed" in turn_log
    print(
        f"\ndrained {owner} mid-reply: reply completed, 0 underruns, heard {loud_ms:.0f} ms of"
        f" {expected_ms} ms, longest quiet run {quiet_ms:.0f} ms; the host exited when empty"
    )
    # another host is killed: within one health interval new sessions go to the last one
    left = [name for name in HOSTS if name != owner]
    killed, survivor = fleet.hosts[left[0]], left[1]
    assert killed.proc is not None
    killed.proc.kill()
    killed.proc.wait()
    await asyncio.sleep(within(1.5))
    last = await open_sessions(http, fleet.url, offer, 4)
    assert all(i.startswith(f"{survivor}.") for i in last), last
    for session_id in [*more, *last]:
        if session_id.startswith(f"{survivor}."):
            async with http.delete(f"{fleet.url}/whip/{session_id}") as resp:
                assert resp.status == 200
