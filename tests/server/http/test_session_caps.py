"""One client cannot keep the server full: live sessions are capped per client address (and per
token when there are several), and a peer whose ICE never connects gives its slot back after
``transport.ice_connect_timeout_s`` instead of the whole ``connect_timeout_s``.

The clients here are named by a trusted proxy's ``X-Forwarded-For`` (the test calls from
127.0.0.1, which the server trusts), so one process plays many addresses.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from server.http.ratelimit import client_key
from server.http.signaling import REGISTRY_KEY
from tests.support.in_process import running
from tests.support.offers import trickle_offer
from tests.support.pace import within
from tests.support.peers import Peer

SDP = {"Content-Type": "application/sdp"}
TOKEN_A = "token-a-0123456789abcdef"
TOKEN_B = "token-b-0123456789abcdef"


@pytest.fixture
async def offer() -> str:
    return await trickle_offer()


async def post(
    http: aiohttp.ClientSession, url: str, offer: str, address: str = "", token: str = ""
) -> tuple[int, str, str | None]:
    """POST /whip as ``address`` (through the trusted proxy; '' : as the peer itself):
    (status, error code or '', Location)."""
    headers = dict(SDP)
    if address:
        headers["X-Forwarded-For"] = address
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with http.post(url + "/whip", data=offer, headers=headers) as resp:
        code = (await resp.json())["code"] if resp.content_type == "application/json" else ""
        if resp.status == 429:
            assert int(resp.headers["Retry-After"]) >= 1
        return resp.status, code, resp.headers.get("Location")


async def test_one_address_cannot_hold_every_slot(offer: str) -> None:
    """The issue's attack: one address opens sessions that never connect. Before, it held all
    4 slots and every other client got 503; now it holds half and the others get in."""
    settings = {"server.trusted_proxies": "127.0.0.1", "transport.max_sessions": "4"}
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        attacker = [await post(http, url, offer, "1.2.3.4") for _ in range(4)]
        assert [(s, c) for s, c, _ in attacker] == [
            (201, ""),
            (201, ""),
            (429, "too_many_sessions"),
            (429, "too_many_sessions"),
        ]
        # an IPv6 client is its /64: rotating the interface id does not buy more sessions
        v6 = [await post(http, url, offer, f"2001:db8:5:6::{i}") for i in (1, 2, 3)]
        assert [s for s, _, _ in v6] == [201, 201, 429]
        assert len(app[REGISTRY_KEY]) == 4
        for _, _, location in v6[:2]:
            assert location is not None
            async with http.delete(url + location, headers={"X-Forwarded-For": "2001:db8:5:6::1"}):
                pass
        created = 0
        for i in range(15):  # other clients, one after another, each ending its session
            status, _, location = await post(http, url, offer, f"5.6.7.{10 + i}")
            if status == 201:
                created += 1
                assert location is not None
                async with http.delete(url + location) as resp:
                    assert resp.status == 200
        print(f"15 other clients while one address holds what it may: {created} got in")
        assert created == 15
        assert len(app[REGISTRY_KEY]) <= 2  # the attacker's two, until they time out


async def test_one_token_cannot_hold_every_slot(offer: str) -> None:
    """With several tokens, a token is a client too, whatever addresses it calls from."""
    settings = {
        "server.trusted_proxies": "127.0.0.1",
        "server.auth_tokens": f"{TOKEN_A},{TOKEN_B}",
        "transport.max_sessions": "4",
    }
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        spread = [await post(http, url, offer, f"1.1.1.{i}", TOKEN_A) for i in (1, 2, 3)]
        assert [(s, c) for s, c, _ in spread] == [
            (201, ""),
            (201, ""),
            (429, "too_many_sessions"),
        ]
        assert (await post(http, url, offer, "1.1.1.9", TOKEN_B))[0] == 201
        assert len(app[REGISTRY_KEY]) == 3


async def test_loopback_clients_are_capped_only_when_told(offer: str) -> None:
    """On this machine (or behind a proxy not listed as trusted) every client is 127.0.0.1:
    the automatic cap leaves loopback alone; an explicit one applies to every address."""
    auto = {"transport.max_sessions": "4"}
    async with running(auto) as (url, _), aiohttp.ClientSession() as http:
        assert [(await post(http, url, offer))[0] for _ in range(5)] == [201] * 4 + [503]
    explicit = {"transport.max_sessions": "4", "transport.max_sessions_per_client": "1"}
    async with running(explicit) as (url, _), aiohttp.ClientSession() as http:
        assert [(await post(http, url, offer))[:2] for _ in range(2)] == [
            (201, ""),
            (429, "too_many_sessions"),
        ]


def test_client_keys_group_an_ipv6_client_by_its_64() -> None:
    assert client_key("192.0.2.7") == "192.0.2.7"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9")
    assert client_key("2001:db8:1:2::1") != client_key("2001:db8:1:3::1")
    assert client_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert client_key("::1") == "::1"
    assert client_key("fe80::1") != client_key("fe80::2")  # every link has fe80::/64
    assert client_key("unknown") == "unknown"


async def test_a_peer_whose_ice_never_connects_gives_its_slot_back_early(
    offer: str, peers: list[Peer]
) -> None:
    """A session that never connects is closed after the ICE timeout (1 s here), long before
    the connect timeout (600 s here); a peer that does connect is left alone."""
    settings = {"transport.ice_connect_timeout_s": "1", "transport.connect_timeout_s": "600"}
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        status, _, _ = await post(http, url, offer)
        assert status == 201 and len(app[REGISTRY_KEY]) == 1
        peer = Peer(url, video=False)
        peers.append(peer)
        await peer.connect()
        deadline = time.monotonic() + within(10)
        while len(app[REGISTRY_KEY]) > 1:
            assert time.monotonic() < deadline, "the unconnected session was not closed"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # past the ICE timeout: the connected peer stays
        (live,) = app[REGISTRY_KEY].peers.values()
        assert live.pc.connectionState == "connected"
