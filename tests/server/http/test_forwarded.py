"""The client's address behind reverse proxies (server/http/forwarded.py), and the attack of
SECURITY.md it answers: behind HAProxy's ``option forwardfor`` a client wrote its own
``X-Forwarded-For`` line, the server read it, and 25 of 25 requests passed a rate limit that
lets 17 through; ``X-Forwarded-For: 127.0.0.1`` made a client loopback."""

from __future__ import annotations

import aiohttp
import pytest
from multidict import CIMultiDict

from server.clock import FakeClock
from server.config import load_config
from server.errors import ConfigError
from server.http.forwarded import TrustedProxies
from server.http.ratelimit import RateLimiter
from tests.support.in_process import running


def test_the_right_most_address_no_trusted_proxy_wrote_is_the_client() -> None:
    proxies = TrustedProxies.parse(["10.0.0.0/8", "192.0.2.10", "fd00::/8"])
    # one proxy: it appended the client
    assert proxies.client("10.1.2.3", ["203.0.113.9"]) == "203.0.113.9"
    # the client's own line first, the proxy's second (option forwardfor): the proxy's counts
    assert proxies.client("10.1.2.3", ["127.0.0.1", "203.0.113.9"]) == "203.0.113.9"
    assert proxies.client("10.1.2.3", ["127.0.0.1, 198.51.100.1, 203.0.113.9"]) == "203.0.113.9"
    # two trusted hops (a TLS proxy, then HAProxy), each appending what it saw
    assert proxies.client("192.0.2.10", ["6.6.6.6, 203.0.113.9, 10.4.4.4"]) == "203.0.113.9"
    # an untrusted peer's header is ignored
    assert proxies.client("198.51.100.7", ["127.0.0.1"]) == "198.51.100.7"
    # an entry that is no address stops the walk at the proxy that wrote it
    assert proxies.client("10.1.2.3", ["203.0.113.9, garbage"]) == "10.1.2.3"
    # IPv6 (bracketed with a port too) and IPv4-mapped forms
    assert proxies.client("fd00::1", ["[2001:db8::5]:443"]) == "2001:db8::5"
    assert proxies.client("::ffff:10.0.0.1", ["203.0.113.9"]) == "203.0.113.9"
    # every hop trusted: the left-most, an internal client
    assert proxies.client("10.1.2.3", ["10.9.9.9"]) == "10.9.9.9"
    assert TrustedProxies().client("127.0.0.1", ["203.0.113.9"]) == "127.0.0.1"


def test_trusted_proxies_are_addresses_or_ranges() -> None:
    config = load_config(overrides={"server.trusted_proxies": "10.0.0.0/8,127.0.0.1,fd00::/8"})
    assert TrustedProxies.parse(config.server.trusted_proxies).trusts("10.200.3.4")
    for wrong in ("caddy", "10.0.0.0/33", "example.com"):
        with pytest.raises(ConfigError, match=r"server\.trusted_proxies.*neither"):
            load_config(overrides={"server.trusted_proxies": wrong})


async def test_a_client_behind_the_proxy_cannot_choose_its_address() -> None:
    """The attack: a new forged address on every request, behind a proxy that appends."""
    limiter = RateLimiter(rate_per_min=1, burst=2, clock=FakeClock())
    settings = {"server.trusted_proxies": "127.0.0.0/8"}  # a range: the proxy is on loopback

    async def status(http: aiohttp.ClientSession, url: str, forged: str) -> int:
        lines = [("X-Forwarded-For", forged), ("X-Forwarded-For", "192.0.2.1")]
        headers = CIMultiDict([("Content-Type", "text/plain"), *lines])
        async with http.post(url + "/whip", data="x", headers=headers) as resp:
            return resp.status

    async with running(settings, limiter) as (url, _), aiohttp.ClientSession() as http:
        forged = [f"198.51.100.{i}" for i in range(1, 24)] + ["127.0.0.1", "::1"]
        statuses = [await status(http, url, address) for address in forged]
    # 415 (the rate limit let it through to the body check), then 429 for the rest: one
    # client, 192.0.2.1, whatever it wrote
    assert statuses == [415, 415] + [429] * 23
