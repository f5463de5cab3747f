"""Client secrets: ``POST /v1/realtime/client_secrets`` mints an ``ek_`` key with a server token;
the key creates one session (``POST /v1/realtime/calls``, ``/offer``, ``/whip``) before it
expires, owned by the minting token and configured by the key's session.

The responses are validated with the official ``openai`` package's model
(``ClientSecretCreateResponse``); expiry runs on a fake clock. The end-to-end test makes a real
aiortc call with the key and reads the key's session in ``session.created``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiortc import RTCSessionDescription
from openai import AsyncOpenAI, AuthenticationError
from openai.types.realtime import ClientSecretCreateResponse

from client.cli import GA_EVENTS
from server.clock import FakeClock
from server.config import load_config
from server.errors import BadRequest, TooManyRequests, Unauthorized
from server.http.app import METRICS_KEY, create_app
from server.http.auth import token_digest
from server.http.client_secrets import (
    DEFAULT_TTL_S,
    SECRET_BYTES,
    SECRETS_KEY,
    ClientSecrets,
    lifetime_s,
)
from server.http.signaling import REGISTRY_KEY
from server.owner import NO_OWNER
from server.pipeline.wiring import detector_factory
from server.wire.realtime_session import SessionPatch
from tests.support.offers import trickle_offer
from tests.support.pace import within
from tests.support.peers import Peer

TOKEN_A = "token-a-0123456789abcdef"
TOKEN_B = "token-b-0123456789abcdef"
SETTINGS = {"server.auth_tokens": f"{TOKEN_A},{TOKEN_B}"}
SECRETS = "/v1/realtime/client_secrets"
CALLS = "/v1/realtime/calls"
EPOCH_S = 1_700_000_000.0  # the fake wall clock's start (unix s)
INSTRUCTIONS = "You are the guide of the lighthouse."


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def serving(
    settings: dict[str, str] | None = None, clock: FakeClock | None = None
) -> AsyncIterator[tuple[str, web.Application]]:
    """(base URL, app) on a free loopback port, no reply pipeline; with ``clock`` the keys
    live on it (the wall clock starts at ``EPOCH_S`` and moves with it)."""
    config = load_config(
        overrides={
            "pipeline.factory": "",
            "transport.video": "false",
            "transport.ice_host_addresses": "127.0.0.1",
            **(settings or {}),
        }
    )
    app = create_app(config, detector_factory(config))
    if clock is not None:
        fake, counter = clock, app[METRICS_KEY].client_secrets
        app[SECRETS_KEY] = ClientSecrets(
            fake, lambda: EPOCH_S + fake.now_ms() / 1000, count=lambda e: counter.labels(e).inc()
        )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}", app
    finally:
        await server.close()


async def mint(
    http: aiohttp.ClientSession, url: str, token: str | None, body: Any = None
) -> aiohttp.ClientResponse:
    headers = {} if token is None else bearer(token)
    async with http.post(url + SECRETS, json=body, headers=headers) as resp:
        await resp.read()
        return resp


async def minted(http: aiohttp.ClientSession, url: str, token: str | None, body: Any = None) -> Any:
    """The JSON of a successful mint, validated by the openai package's model."""
    headers = {} if token is None else bearer(token)
    async with http.post(url + SECRETS, json=body, headers=headers) as resp:
        data = await resp.json()
        assert resp.status == 200, data
        assert resp.headers["Cache-Control"] == "no-store"
    ClientSecretCreateResponse.model_validate(data)
    return data


async def post_call(
    http: aiohttp.ClientSession, url: str, key: str, sdp: str
) -> tuple[int, dict[str, Any] | str, str | None]:
    """``POST /v1/realtime/calls`` (plain SDP) with ``key``: (status, JSON error or the
    answer, Location)."""
    headers = {"Content-Type": "application/sdp", **bearer(key)}
    async with http.post(url + CALLS, data=sdp, headers=headers) as resp:
        if resp.status == 201:
            return resp.status, await resp.text(), resp.headers["Location"]
        return resp.status, await resp.json(), None


# the store alone, on a fake clock


def test_a_key_is_random_stored_as_a_digest_and_expires_on_the_clock() -> None:
    clock = FakeClock(5_000.0)
    counted: list[str] = []
    store = ClientSecrets(clock, lambda: EPOCH_S + 0.75, count=counted.append)
    patch = SessionPatch({"persona": INSTRUCTIONS})
    one = store.mint(token_digest(TOKEN_A), patch, 60)
    two = store.mint(NO_OWNER, None, 60)
    assert one.value.startswith("ek_") and one.value != two.value
    assert len(one.value) >= len("ek_") + SECRET_BYTES * 4 // 3  # 32 random bytes
    assert one.secret.digest == token_digest(one.value)
    assert one.value not in repr(one.secret)  # the record never holds the key
    assert one.secret.expires_at == int(EPOCH_S) + 60
    assert one.secret.deadline_ms == pytest.approx(5_000 + 59_250)  # no later than expires_at
    clock.advance(59_000)
    claimed = store.claim(one.value)
    assert claimed is not None and claimed.patch == patch
    assert claimed.owner == token_digest(TOKEN_A)
    store.settle(claimed)
    with pytest.raises(Unauthorized, match="used already"):
        store.claim(one.value)
    clock.advance(250)
    with pytest.raises(Unauthorized, match="expired"):
        store.claim(two.value)
    assert len(store) == 0  # both dropped at their deadline
    assert store.claim(one.value) is None  # gone: unknown
    assert store.claim("ek_never-issued") is None
    assert counted == ["minted", "minted", "used", "expired"]


def test_a_released_key_may_be_used_again_and_the_store_is_bounded() -> None:
    clock = FakeClock()
    store = ClientSecrets(clock, lambda: EPOCH_S, capacity=2, prefix="h1.w2-")
    first = store.mint(NO_OWNER, None, 10)
    assert first.value.startswith("ek_h1.w2-")  # names the worker that holds it
    claimed = store.claim(first.value)
    assert claimed is not None
    store.release(claimed)  # the session was not created
    assert store.claim(first.value) is not None
    clock.advance(4_000)
    store.mint(NO_OWNER, None, 30)
    with pytest.raises(TooManyRequests) as full:
        store.mint(NO_OWNER, None, 30)
    assert full.value.headers["Retry-After"] == "6"  # when the first kept key expires
    clock.advance(6_000)
    store.mint(NO_OWNER, None, 30)  # the expired one made room
    assert len(store) == 2


def test_the_lifetime_is_checked() -> None:
    assert lifetime_s(None) == DEFAULT_TTL_S == 600
    assert lifetime_s({}) == 600
    assert lifetime_s({"anchor": "created_at", "seconds": 10}) == 10
    assert lifetime_s({"seconds": 7200}) == 7200
    for bad in (
        {"seconds": 9},
        {"seconds": 7201},
        {"seconds": "600"},
        {"seconds": 600.5},
        {"seconds": True},
        {"anchor": "now", "seconds": 60},
        {"seconds": 60, "extra": 1},
        [60],
        60,
    ):
        with pytest.raises(BadRequest):
            lifetime_s(bad)


# over HTTP


async def test_a_server_token_mints_a_key_of_openais_shape() -> None:
    async with serving(SETTINGS) as (url, app):
        client = AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN_A, max_retries=0)
        before = time.time()
        made = await client.realtime.client_secrets.create(
            expires_after={"anchor": "created_at", "seconds": 120},
            session={
                "type": "realtime",
                "instructions": INSTRUCTIONS,
                "audio": {"output": {"voice": "marin"}},
                "output_modalities": ["text"],
            },
        )
        assert isinstance(made, ClientSecretCreateResponse)
        assert made.value.startswith("ek_")
        assert int(before) + 120 <= made.expires_at <= time.time() + 120
        session = made.session
        assert session.type == "realtime"
        assert session.instructions == INSTRUCTIONS
        assert session.output_modalities == ["text"]
        assert session.audio is not None and session.audio.output is not None
        assert session.audio.output.voice == "marin"
        async with aiohttp.ClientSession() as http:
            # both fields optional: the defaults (600 s, the server's own session)
            data = await minted(http, url, TOKEN_B, {})
            assert data["expires_at"] - time.time() == pytest.approx(600, abs=5)
            config = app[REGISTRY_KEY].config
            assert data["session"]["instructions"] == config.runtime.persona
            assert data["session"]["audio"]["output"]["voice"] == config.runtime.voice
            # no body at all
            async with http.post(url + SECRETS, headers=bearer(TOKEN_A)) as resp:
                assert resp.status == 200, await resp.text()
        assert len(app[SECRETS_KEY]) == 3


async def test_minting_needs_a_server_token_and_a_good_body() -> None:
    async with serving(SETTINGS) as (url, app):
        stranger = AsyncOpenAI(base_url=url + "/v1", api_key="not-a-token", max_retries=0)
        with pytest.raises(AuthenticationError):
            await stranger.realtime.client_secrets.create()
        async with aiohttp.ClientSession() as http:
            resp = await mint(http, url, None)
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            key = (await minted(http, url, TOKEN_A))["value"]
            async with http.post(url + SECRETS, json={}, headers=bearer(key)) as refused:
                assert refused.status == 401  # a key cannot mint another
            bad_bodies: list[Any] = [
                {"expires_after": {"seconds": 5}},
                {"expires_after": {"seconds": 7201}},
                {"expires_after": {"seconds": "60"}},
                {"expires_after": {"anchor": "expires_at", "seconds": 60}},
                {"expires_after": 60},
                {"session": {"type": "realtime", "tools": [{"type": "mcp", "server_label": "f"}]}},
                {"session": {"type": "transcription"}},
                {"session": {"instructions": ""}},
                {"session": {"audio": {"input": {"turn_detection": None}}}},
                {"session": "realtime"},
                {"sessions": {}},
                [],
            ]
            for body in bad_bodies:
                async with http.post(url + SECRETS, json=body, headers=bearer(TOKEN_A)) as resp:
                    data = await resp.json()
                    assert resp.status == 400, (body, data)
                    assert data["error"]["type"] == "invalid_request_error"  # OpenAI's shape
                    assert data["error"]["message"]
            headers = {"Content-Type": "application/json", **bearer(TOKEN_A)}
            async with http.post(url + SECRETS, data="{", headers=headers) as resp:
                assert resp.status == 400
            headers = {"Content-Type": "text/plain", **bearer(TOKEN_A)}
            async with http.post(url + SECRETS, data="{}", headers=headers) as resp:
                assert resp.status == 415
        assert len(app[SECRETS_KEY]) == 1  # only the good one was minted


async def test_a_key_creates_one_session_owned_by_the_minting_token() -> None:
    async with serving(SETTINGS) as (url, app):
        registry = app[REGISTRY_KEY]
        async with aiohttp.ClientSession() as http:
            key = (await minted(http, url, TOKEN_A))["value"]
            # a refused call does not spend the key
            status, error, _ = await post_call(http, url, key, "not an offer")
            assert status == 400, error
            status, _, location = await post_call(http, url, key, await trickle_offer())
            assert status == 201 and location is not None
            status, error, _ = await post_call(http, url, key, await trickle_offer())
            assert status == 401
            assert isinstance(error, dict)
            assert "used already" in error["error"]["message"]
            assert len(registry) == 1
            (conversation,) = registry.conversations.values()
            assert conversation.owner == token_digest(TOKEN_A)
            # the session is the minting token's: not the key's, nor another token's
            async with http.delete(url + location, headers=bearer(key)) as resp:
                assert resp.status == 401
            async with http.delete(url + location, headers=bearer(TOKEN_B)) as resp:
                assert resp.status == 403
            async with http.delete(url + location, headers=bearer(TOKEN_A)) as resp:
                assert resp.status == 200
            assert len(registry) == 0
            # a key made up, or a server token where the key goes, as ever
            status, error, _ = await post_call(http, url, "ek_" + "x" * 43, "v=0")
            assert status == 401
            assert isinstance(error, dict)
            assert "unknown or expired" in error["error"]["message"]
            # /whip takes keys too, one session each
            key = (await minted(http, url, TOKEN_B))["value"]
            whip = {"Content-Type": "application/sdp", **bearer(key)}
            async with http.post(url + "/whip", data=await trickle_offer(), headers=whip) as resp:
                assert resp.status == 201, await resp.text()
                assert registry.owner_of(resp.headers["Location"].rsplit("/", 1)[1]) == (
                    token_digest(TOKEN_B)
                )
            async with http.post(url + "/whip", data=await trickle_offer(), headers=whip) as resp:
                assert resp.status == 401
            assert len(registry) == 1


async def test_a_key_expires_at_its_expires_at() -> None:
    clock = FakeClock(1_000.0)
    async with serving(SETTINGS, clock) as (url, app), aiohttp.ClientSession() as http:
        body = {"expires_after": {"anchor": "created_at", "seconds": 10}}
        made = await minted(http, url, TOKEN_A, body)
        assert made["expires_at"] == int(EPOCH_S) + 1 + 10  # the clock started at 1 s
        spare = (await minted(http, url, TOKEN_A, body))["value"]
        clock.advance(10_000)  # expires_at reached
        status, error, _ = await post_call(http, url, made["value"], await trickle_offer())
        assert status == 401, error
        assert isinstance(error, dict) and "expired" in error["error"]["message"]
        assert len(app[REGISTRY_KEY]) == 0
        clock.advance(1)
        status, error, _ = await post_call(http, url, spare, await trickle_offer())
        assert status == 401  # dropped: unknown or expired
        assert len(app[SECRETS_KEY]) == 0
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
        assert 'avatar_client_secrets_total{event="minted"} 2.0' in text
        assert 'avatar_client_secrets_total{event="expired"} 2.0' in text


async def test_without_server_tokens_anyone_may_mint_on_loopback() -> None:
    async with serving() as (url, app), aiohttp.ClientSession() as http:
        key = (await minted(http, url, None))["value"]
        status, _, location = await post_call(http, url, key, await trickle_offer())
        assert status == 201 and location is not None
        (conversation,) = app[REGISTRY_KEY].conversations.values()
        assert conversation.owner == NO_OWNER
        status, _, _ = await post_call(http, url, key, await trickle_offer())
        assert status == 401  # still one session per key
        # a key it never minted admits as any token does without tokens (an app's dev set-up
        # with a key of its own), with no session of its own
        status, _, _ = await post_call(http, url, "ek_made-up", await trickle_offer())
        assert status == 201
        async with http.get(url + "/metrics") as resp:
            assert 'avatar_client_secrets_total{event="used"} 1.0' in await resp.text()


async def test_the_endpoint_answers_preflights() -> None:
    origin = "https://app.example"
    async with serving({**SETTINGS, "server.cors_origins": origin}) as (url, _):
        headers = {
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        async with aiohttp.ClientSession() as http:
            async with http.options(url + SECRETS, headers=headers) as resp:
                assert resp.status == 204
                assert resp.headers["Allow"] == "OPTIONS, POST"
                assert resp.headers["Access-Control-Allow-Origin"] == origin
                assert "POST" in resp.headers["Access-Control-Allow-Methods"]
                assert "Authorization" in resp.headers["Access-Control-Allow-Headers"]
            refused = {**headers, "Origin": "https://elsewhere.example"}
            async with http.options(url + SECRETS, headers=refused) as resp:
                assert resp.status == 403


@pytest.mark.usefixtures("client_ice")
async def test_a_browser_calls_with_a_key_and_gets_its_session(peers: list[Peer]) -> None:
    async with serving(SETTINGS) as (url, app):
        backend = AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN_A, max_retries=0)
        made = await backend.realtime.client_secrets.create(
            session={
                "type": "realtime",
                "instructions": INSTRUCTIONS,
                "audio": {"output": {"voice": "cedar"}},
            }
        )
        # the page: the key as its API key, a form session given with the call on top
        page = AsyncOpenAI(base_url=url + "/v1", api_key=made.value, max_retries=0)
        peer = Peer(url, video=False, events_label=GA_EVENTS)
        peers.append(peer)
        peer.pc.addTrack(peer.mic)
        await peer.pc.setLocalDescription(await peer.pc.createOffer())
        answer = await page.realtime.calls.create(
            sdp=peer.pc.localDescription.sdp,
            session={"type": "realtime", "audio": {"output": {"voice": "marin"}}},
        )
        assert answer.response.status_code == 201
        location = answer.response.headers["Location"]
        await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        await asyncio.wait_for(peer.channel_open.wait(), within(15))
        created = await peer.wait_event("session.created")
        assert created["session"]["instructions"] == INSTRUCTIONS  # the key's
        assert created["session"]["audio"]["output"]["voice"] == "marin"  # the form's, after it
        with pytest.raises(AuthenticationError, match="used already"):
            await page.realtime.calls.create(sdp=peer.pc.localDescription.sdp)
        (conversation,) = app[REGISTRY_KEY].conversations.values()
        assert conversation.owner == token_digest(TOKEN_A)
        async with (
            aiohttp.ClientSession() as http,
            http.delete(url + location, headers=bearer(TOKEN_A)) as resp,
        ):
            assert resp.status == 200
        peer.location = None
        assert len(app[REGISTRY_KEY]) == 0


async def test_the_websocket_takes_a_key_once_and_applies_its_session() -> None:
    """``GET /v1/realtime`` with an ``ek_`` key, as the ``openai`` package's client and a
    browser's subprotocol send it: the key's instructions are the session's from
    ``session.created`` on, its owner the minting token's, and a second use is refused."""
    async with serving(SETTINGS) as (url, app):
        registry = app[REGISTRY_KEY]
        async with aiohttp.ClientSession() as http:
            body = {"session": {"type": "realtime", "instructions": INSTRUCTIONS}}
            key = (await minted(http, url, TOKEN_A, body))["value"]
        client = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        async with client.realtime.connect(model="gpt-realtime") as connection:
            created = await asyncio.wait_for(connection.recv(), within(10))
            assert created.type == "session.created"
            assert created.session.instructions == INSTRUCTIONS  # type: ignore[union-attr]
            (conversation,) = registry.conversations.values()
            assert conversation.owner == token_digest(TOKEN_A)
        ws_url = url.replace("http", "ws") + "/v1/realtime?model=gpt-realtime"
        async with aiohttp.ClientSession() as http:
            protocols = ("realtime", f"openai-insecure-api-key.{key}")
            with pytest.raises(aiohttp.WSServerHandshakeError) as again:
                await http.ws_connect(ws_url, protocols=protocols)
            assert again.value.status == 401
