"""Who may call: bearer tokens (and the resource owner rule), CORS origins, per-address rate
limits on session creation, SDP size limits; on the real app with real aiortc offers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from server.clock import FakeClock
from server.config import load_config
from server.errors import ConfigError, Unauthorized
from server.http.auth import (
    BearerAuth,
    CorsPolicy,
    anonymous_turn,
    exposure_warning,
    token_digest,
)
from server.http.ratelimit import RateLimiter
from server.http.signaling import REGISTRY_KEY
from tests.support.in_process import running

TOKEN_A = "token-a-0123456789abcdef"
TOKEN_B = "token-b-0123456789abcdef"
SDP = "application/sdp"


# --- the pure parts ---------------------------------------------------------------------------
def test_token_bucket_allows_a_burst_then_refills_on_the_injected_clock() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_min=6, burst=2, clock=clock)  # one token per 10 s
    assert limiter.take("a").allowed and limiter.take("a").allowed
    refused = limiter.take("a")
    assert not refused.allowed and refused.retry_after_s == 10
    assert limiter.take("b").allowed  # another address has its own bucket
    clock.advance(4_000)
    assert limiter.take("a").retry_after_s == 6
    clock.advance(6_000)
    assert limiter.take("a").allowed and not limiter.take("a").allowed
    clock.advance(3_600_000)  # a long pause refills to the burst, never beyond
    assert [limiter.take("a").allowed for _ in range(3)] == [True, True, False]


def test_rate_limiter_off_and_bounded() -> None:
    clock = FakeClock()
    assert all(RateLimiter(0, 1, clock).take("a").allowed for _ in range(100))
    limiter = RateLimiter(60, 1, clock, max_keys=3)
    for key in "abcde":
        limiter.take(key)
    assert len(limiter) == 3  # the least recently used addresses are forgotten


def test_bearer_auth() -> None:
    assert BearerAuth(()).authenticate(None) == ""  # off: everyone is the same nobody
    auth = BearerAuth((TOKEN_A, TOKEN_B))
    assert auth.authenticate(f"Bearer {TOKEN_A}") == token_digest(TOKEN_A)
    assert auth.authenticate(f"bearer  {TOKEN_B} ") == token_digest(TOKEN_B)
    for header in (None, "", TOKEN_A, f"Basic {TOKEN_A}", "Bearer ", "Bearer wrong-token-xxxxxx"):
        with pytest.raises(Unauthorized) as err:
            auth.authenticate(header)
        assert err.value.headers["WWW-Authenticate"].startswith("Bearer")
    with pytest.raises(ConfigError):
        BearerAuth(("short",))


def test_tokens_from_the_environment_are_checked_and_never_printed() -> None:
    config = load_config(env={"AVATAR_SERVER_AUTH_TOKENS": f"{TOKEN_A}, {TOKEN_B}"})
    assert config.server.auth_tokens == (TOKEN_A, TOKEN_B)
    assert TOKEN_A not in repr(config) and TOKEN_B not in repr(config)
    with pytest.raises(ConfigError, match=r"server\.auth_tokens"):
        load_config(env={"AVATAR_SERVER_AUTH_TOKENS": "tooshort"})


def test_cors_policy_and_exposure_warning() -> None:
    policy = CorsPolicy(("https://app.example",))
    assert policy.allows("https://app.example", "api.example")
    assert policy.allows("https://APP.example/", "api.example")
    assert policy.allows("http://127.0.0.1:8080", "127.0.0.1:8080")  # same origin
    assert not policy.allows("https://evil.example", "api.example")
    assert CorsPolicy(("*",)).allows("https://any.example", "api.example")
    assert exposure_warning("127.0.0.1", ()) is None
    assert exposure_warning("::1", ()) is None
    assert exposure_warning("0.0.0.0", (TOKEN_A,)) is None
    warning = exposure_warning("0.0.0.0", ())
    assert warning is not None and "auth_tokens" in warning


def test_anonymous_turn_is_for_loopback_servers_unless_set() -> None:
    assert load_config().transport.ice_anonymous_turn == "auto"
    assert anonymous_turn("auto", "127.0.0.1") and anonymous_turn("auto", "::1")
    assert anonymous_turn("auto", "localhost")
    assert not anonymous_turn("auto", "0.0.0.0") and not anonymous_turn("auto", "10.1.2.3")
    assert anonymous_turn("allow", "0.0.0.0") and not anonymous_turn("deny", "127.0.0.1")
    with pytest.raises(ConfigError, match="ice_anonymous_turn"):
        load_config(env={"AVATAR_TRANSPORT_ICE_ANONYMOUS_TURN": "sometimes"})


# --- the real app -----------------------------------------------------------------------------
@pytest.fixture
async def offer() -> AsyncIterator[str]:
    """A real aiortc offer (audio + events channel)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("events")
    await pc.setLocalDescription(await pc.createOffer())
    yield pc.localDescription.sdp
    await pc.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_tokens_guard_creation_and_only_the_creator_may_end_a_resource(offer: str) -> None:
    settings = {
        "server.debug_endpoints": "true",  # transcripts are there: behind the token too
        "server.auth_tokens": f"{TOKEN_A},{TOKEN_B}",
        "transport.ice_urls": "turn:turn.example.net:3478",
        "transport.ice_auth_secret": "north-wind",
    }
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        sdp = {"Content-Type": SDP}
        # TURN credentials only for token holders
        async with http.get(url + "/ice-servers") as resp:
            assert resp.status == 401
        async with http.get(url + "/ice-servers", headers=bearer(TOKEN_B)) as resp:
            assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
            (turn,) = (await resp.json())["iceServers"]
            assert turn["urls"] == ["turn:turn.example.net:3478"]
            assert turn["username"].endswith(":client") and turn["credential"]
        for headers in (sdp, {**sdp, **bearer("not-a-configured-token")}):
            async with http.post(url + "/whip", data=offer, headers=headers) as resp:
                assert resp.status == 401
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
                assert (await resp.json())["code"] == "unauthorized"
        async with http.post(url + "/offer", json={"type": "offer", "sdp": offer}) as resp:
            assert resp.status == 401
        async with http.get(url + "/debug/sessions") as resp:
            assert resp.status == 401  # transcripts are behind the token too
        assert len(app[REGISTRY_KEY]) == 0
        async with http.post(url + "/whip", data=offer, headers={**sdp, **bearer(TOKEN_A)}) as r:
            assert r.status == 201
            location, etag = r.headers["Location"], r.headers["ETag"]
        frag = {"Content-Type": "application/trickle-ice-sdpfrag", "If-Match": etag}
        for method, headers, status in (
            ("DELETE", {}, 401),
            ("DELETE", bearer(TOKEN_B), 403),
            ("PATCH", {**frag, **bearer(TOKEN_B)}, 403),
        ):
            async with http.request(method, url + location, headers=headers, data="") as resp:
                assert resp.status == status, (method, await resp.text())
        assert len(app[REGISTRY_KEY]) == 1
        async with http.get(url + "/debug/sessions", headers=bearer(TOKEN_B)) as resp:
            assert resp.status == 200
            # polled during calls: no garbage collection (it holds the loop), no peer count
            assert (await resp.json())["peer_objects"] is None
        query = "/debug/sessions?collect=1"
        async with http.get(url + query, headers=bearer(TOKEN_B)) as resp:
            assert (await resp.json())["peer_objects"] == 1  # TOKEN_A's session, still live
        async with http.delete(url + location, headers=bearer(TOKEN_A)) as resp:
            assert resp.status == 200
        assert len(app[REGISTRY_KEY]) == 0


async def test_session_creation_is_rate_limited_per_address() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_min=2, burst=2, clock=clock)  # one token per 30 s
    async with running(limiter=limiter) as (url, app), aiohttp.ClientSession() as http:
        plain = {"Content-Type": "text/plain"}  # cheap attempts: they count all the same
        for _ in range(2):
            async with http.post(url + "/whip", data="x", headers=plain) as resp:
                assert resp.status == 415
        async with http.post(url + "/whip", data="x", headers=plain) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "30"
            body = await resp.json()
            assert body["code"] == "rate_limited" and body["error"]
        async with http.post(url + "/offer", json={}) as resp:
            assert resp.status == 429  # one bucket for both ways in
        async with http.get(url + "/healthz") as resp:
            assert resp.status == 200  # only session creation is limited
        clock.advance(30_000)
        async with http.post(url + "/whip", data="x", headers=plain) as resp:
            assert resp.status == 415  # a token came back
        assert len(app[REGISTRY_KEY]) == 0


async def test_forwarded_addresses_count_only_from_trusted_proxies() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate_per_min=1, burst=1, clock=clock)
    plain = {"Content-Type": "text/plain"}

    async def status(http: aiohttp.ClientSession, url: str, client: str) -> int:
        headers = {**plain, "X-Forwarded-For": f"203.0.113.9, {client}"}
        async with http.post(url + "/whip", data="x", headers=headers) as resp:
            return resp.status

    trusted = {"server.trusted_proxies": "127.0.0.1"}
    async with running(trusted, limiter) as (url, _), aiohttp.ClientSession() as http:
        assert [await status(http, url, c) for c in ("192.0.2.1", "192.0.2.2")] == [415, 415]
        assert await status(http, url, "192.0.2.1") == 429
    limiter = RateLimiter(rate_per_min=1, burst=1, clock=clock)
    async with running(limiter=limiter) as (url, _), aiohttp.ClientSession() as http:
        # not a trusted proxy: the header is ignored, the peer address counts
        assert [await status(http, url, c) for c in ("192.0.2.1", "192.0.2.2")] == [415, 429]


async def test_cors_allows_configured_and_own_origins_only() -> None:
    settings = {"server.cors_origins": "https://app.example"}
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        preflight = {
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        async with http.options(url + "/whip", headers=preflight) as resp:
            assert resp.status == 204
            assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "POST" in resp.headers["Access-Control-Allow-Methods"]
            assert "Authorization" in resp.headers["Access-Control-Allow-Headers"]
            assert "Link" not in resp.headers
        async with http.options(url + "/offer", headers=preflight) as resp:
            assert resp.status == 204
        headers = {"Origin": "https://app.example", "Content-Type": SDP}
        async with http.post(url + "/whip", data="garbage", headers=headers) as resp:
            assert resp.status == 400  # errors carry CORS headers: the page can read them
            assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "Location" in resp.headers["Access-Control-Expose-Headers"]
        evil = {**preflight, "Origin": "https://evil.example"}
        async with http.options(url + "/whip", headers=evil) as resp:
            assert resp.status == 403
            assert "Access-Control-Allow-Origin" not in resp.headers
        async with http.post(url + "/whip", data="x", headers={**headers, **evil}) as resp:
            assert resp.status == 403 and (await resp.json())["code"] == "forbidden"
        own = {"Origin": url, "Content-Type": SDP}
        async with http.post(url + "/whip", data="garbage", headers=own) as resp:
            assert resp.status == 400 and resp.headers["Access-Control-Allow-Origin"] == url
        async with http.get(url + "/healthz") as resp:
            assert "Access-Control-Allow-Origin" not in resp.headers  # no Origin, no CORS
        assert len(app[REGISTRY_KEY]) == 0


async def test_cors_lets_openais_sdks_send_their_own_headers_to_the_openai_api() -> None:
    """OpenAI's Agents SDK sends ``X-OpenAI-Agents-SDK`` with every offer; a browser page on
    another origin asks for it in its preflight and fails the call ("Failed to fetch") unless
    it is allowed. On ``/v1/`` what the preflight asks for is allowed (header names only);
    the server's own paths keep their own list."""
    settings = {"server.cors_origins": "https://app.example"}
    asked = "authorization, content-type, x-openai-agents-sdk, OpenAI-Beta, bad header!, a:b"
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": asked,
    }
    async with running(settings) as (url, _), aiohttp.ClientSession() as http:
        async with http.options(url + "/v1/realtime/calls", headers=preflight) as resp:
            assert resp.status in (200, 204)
            allowed = [
                h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")
            ]
            assert {"authorization", "content-type", "x-openai-agents-sdk", "openai-beta"} <= set(
                allowed
            )
            assert "bad header!" not in allowed and "a:b" not in allowed
            assert "Location" in resp.headers["Access-Control-Expose-Headers"]
        async with http.options(url + "/whip", headers=preflight) as resp:
            assert "x-openai-agents-sdk" not in resp.headers["Access-Control-Allow-Headers"].lower()
        evil = {**preflight, "Origin": "https://evil.example"}
        async with http.options(url + "/v1/realtime/calls", headers=evil) as resp:
            assert resp.status == 403 and "Access-Control-Allow-Headers" not in resp.headers


async def test_sdp_line_and_section_limits(offer: str) -> None:
    settings = {"transport.max_sdp_lines": "60"}
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        long = offer.rstrip("\r\n") + "\r\n" + "a=x-filler\r\n" * 100  # small, but many lines
        async with http.post(url + "/whip", data=long, headers={"Content-Type": SDP}) as resp:
            assert resp.status == 413 and "lines" in (await resp.json())["error"]
        sections = "v=0\r\n" + "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\n" * 20
        async with http.post(url + "/offer", json={"type": "offer", "sdp": sections}) as resp:
            assert resp.status == 400 and "media sections" in (await resp.json())["error"]
        assert len(app[REGISTRY_KEY]) == 0


async def test_without_tokens_turn_credentials_stay_on_loopback_servers() -> None:
    """No tokens: anyone who reaches the server is anonymous. One bound beyond loopback (here
    as configured; the test listens on 127.0.0.1 either way) gives them no TURN credentials,
    unless transport.ice_anonymous_turn says allow: GET /ice-servers answers 403, WHIP's Link
    headers name the STUN server alone."""
    turn = {
        "transport.ice_urls": "stun:stun.example.net:3478,turn:turn.example.net:3478",
        "transport.ice_auth_secret": "north-wind",
    }
    cases: tuple[tuple[dict[str, str], bool], ...] = (
        ({}, True),  # a localhost dev server
        ({"server.host": "0.0.0.0"}, False),
        ({"server.host": "0.0.0.0", "transport.ice_anonymous_turn": "allow"}, True),
        ({"transport.ice_anonymous_turn": "deny"}, False),
    )
    for settings, handed_out in cases:
        async with running({**turn, **settings}) as (url, _), aiohttp.ClientSession() as http:
            async with http.get(url + "/ice-servers") as resp:
                body = await resp.json()
                if handed_out:
                    assert resp.status == 200, settings
                    assert body["iceServers"][1]["username"].endswith(":client")
                else:
                    assert (resp.status, body["code"]) == (403, "turn_needs_token"), settings
                    assert "auth_tokens" in body["error"]
            async with http.options(url + "/whip") as resp:
                links = resp.headers.getall("Link")
                assert links[0] == '<stun:stun.example.net:3478>; rel="ice-server"'
                assert len(links) == (2 if handed_out else 1), settings
    # with tokens the token decides, whatever the setting; a STUN server alone is no secret
    tokens = {"server.auth_tokens": TOKEN_A, "transport.ice_anonymous_turn": "deny"}
    async with running({**turn, **tokens}) as (url, _), aiohttp.ClientSession() as http:
        resp = await http.get(url + "/ice-servers", headers=bearer(TOKEN_A))
        assert resp.status == 200 and len((await resp.json())["iceServers"]) == 2
    stun = {"transport.ice_urls": "stun:stun.example.net:3478", "server.host": "0.0.0.0"}
    async with running(stun) as (url, _), aiohttp.ClientSession() as http:
        resp = await http.get(url + "/ice-servers")
        assert resp.status == 200 and len((await resp.json())["iceServers"]) == 1
