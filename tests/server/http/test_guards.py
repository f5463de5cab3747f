"""The checks every request passes before it is routed (server/http/guards.py), the debug listing
by owner, the access log's short ids, a worker's command line without secrets; on the real
app served in-process."""

from __future__ import annotations

import logging

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection
from yarl import URL

from server.config import load_config
from server.fleet.workers import WORKER_KEY_ENV, split_secrets, worker_command
from server.http.guards import WORKER_KEY_HEADER, HostAllowlist, has_dot_segment, host_name
from server.http.logfilter import ShortSessionIds, short_session_ids
from tests.support.in_process import running

TOKEN_A = "token-a-0123456789abcdef"
TOKEN_B = "token-b-0123456789abcdef"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def an_offer() -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("events")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


# --- the pure parts ---------------------------------------------------------------------------
def test_dot_segments_decoded_or_not() -> None:
    for path in ("/./offer", "/static/../offer", "/%2e/x", "/a/%2E%2E", "/a/..%2fb", "/a\\..\\b"):
        assert has_dot_segment(path), path
    for path in ("/offer", "/static/app.v2.js", "/whip/w1-a.b", "/x?p=/../y", "/...", "/.well"):
        assert not has_dot_segment(path), path


def test_host_allowlist() -> None:
    assert host_name("Avatar.Example.:8080") == "avatar.example"
    assert host_name("[::1]:8080") == "::1" and host_name("a b") is None
    local = HostAllowlist("127.0.0.1", ())
    for host in ("localhost", "localhost:8080", "127.0.0.1:8080", "[::1]:80", "10.1.2.3"):
        assert local.allows(host), host
    for host in ("attacker.example", "attacker.example:8080", "", "localhost.attacker.example"):
        assert not local.allows(host), host
    named = HostAllowlist("avatar.internal", ("Avatar.Example",))
    assert named.allows("avatar.example:443") and named.allows("avatar.internal:8080")
    assert not named.allows("attacker.example")
    assert HostAllowlist("0.0.0.0", ("*",)).allows("anything.example")


def test_access_log_lines_hold_no_whole_session_id() -> None:
    sid = "w1-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcd"
    record = logging.LogRecord(
        "aiohttp.access",
        logging.INFO,
        __file__,
        1,
        '%s "%s" %s',
        ("127.0.0.1", f"PATCH /whip/{sid} HTTP/1.1", 204),
        None,
    )
    assert ShortSessionIds().filter(record)
    assert record.getMessage() == '127.0.0.1 "PATCH /whip/w1-AbCdE… HTTP/1.1" 204'
    assert sid not in record.getMessage()
    assert short_session_ids("GET /healthz") == "GET /healthz"
    call = f"DELETE /v1/realtime/calls/h1.{sid} HTTP/1.1"
    assert short_session_ids(call) == "DELETE /v1/realtime/calls/h1.w1-Ab… HTTP/1.1"
    assert short_session_ids(f"POST /v1/realtime/calls/{sid}/hangup") == (
        "POST /v1/realtime/calls/w1-AbCdE…/hangup"
    )


def test_a_workers_command_line_holds_no_secret() -> None:
    argv = [
        "--set",
        f"server.auth_tokens={TOKEN_A}",
        "--set=transport.ice_auth_secret=north-wind",
        "--set",
        "transport.max_sessions=3",
        "--port",
        "9000",
    ]
    kept, env = split_secrets(argv)
    assert kept == ["--set", "transport.max_sessions=3", "--port", "9000"]
    assert env == {
        "AVATAR_SERVER_AUTH_TOKENS": TOKEN_A,
        "AVATAR_TRANSPORT_ICE_AUTH_SECRET": "north-wind",
    }
    command = worker_command(load_config(), argv, 1, 7)
    assert not any(TOKEN_A in arg or "north-wind" in arg for arg in command)
    # the worker keeps the per-address session limit (the router's key and limit come first)
    assert not any(arg.startswith("transport.session_rate_per_min") for arg in command)
    assert WORKER_KEY_ENV == "AVATAR_SERVER_WORKER_KEY"
    assert load_config(env={WORKER_KEY_ENV: "k" * 32}).server.worker_key == "k" * 32


# --- the real app -----------------------------------------------------------------------------
async def test_a_foreign_host_name_gets_421_on_every_path() -> None:
    """DNS rebinding: a page on attacker.example rebinds its name to 127.0.0.1."""
    async with (
        running({"server.debug_endpoints": "true"}) as (url, _),
        aiohttp.ClientSession() as http,
    ):
        port = URL(url).port
        evil = {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}
        for method, path in (
            ("POST", "/offer"),
            ("GET", "/debug/sessions"),
            ("DELETE", "/whip/abc"),
            ("GET", "/healthz"),
            ("GET", "/"),
        ):
            async with http.request(method, url + path, headers=evil, json={}) as resp:
                assert resp.status == 421, (method, path)
                assert (await resp.json())["code"] == "misdirected_request"
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            async with http.get(url + "/healthz", headers={"Host": host}) as resp:
                assert resp.status == 200, host
    settings = {"server.allowed_hosts": "avatar.example"}
    async with running(settings) as (url, _), aiohttp.ClientSession() as http:
        async with http.get(url + "/healthz", headers={"Host": "avatar.example"}) as resp:
            assert resp.status == 200
        async with http.get(url + "/healthz", headers={"Host": "attacker.example"}) as resp:
            assert resp.status == 421


async def test_paths_with_dot_segments_are_refused() -> None:
    async with running() as (url, _), aiohttp.ClientSession() as http:
        for path in ("/./offer", "/static/../offer", "/%2e%2e/healthz"):
            async with http.post(URL(url + path, encoded=True), json={}) as resp:
                assert resp.status == 400, path


async def test_a_worker_answers_only_requests_with_its_key() -> None:
    key = "k" * 32
    async with running({"server.worker_key": key}) as (url, _), aiohttp.ClientSession() as http:
        for headers in ({}, {WORKER_KEY_HEADER: "wrong"}):
            async with http.get(url + "/healthz", headers=headers) as resp:
                assert resp.status == 403
            async with http.post(url + "/offer", json={}, headers=headers) as resp:
                assert resp.status == 403
        async with http.get(url + "/healthz", headers={WORKER_KEY_HEADER: key}) as resp:
            assert resp.status == 200


async def test_a_missing_static_file_is_a_json_404() -> None:
    async with running() as (url, _), aiohttp.ClientSession() as http:
        async with http.get(url + "/static/nope.js") as resp:
            assert resp.status == 404
            assert (await resp.json())["code"] == "not_found"
        async with http.get(url + "/static/app.js") as resp:
            assert resp.status == 200 and "javascript" in resp.headers["Content-Type"]


async def test_debug_sessions_shows_each_token_its_own_sessions_only() -> None:
    settings = {"server.debug_endpoints": "true", "server.auth_tokens": f"{TOKEN_A},{TOKEN_B}"}
    pcs = []
    async with running(settings) as (url, _), aiohttp.ClientSession() as http:
        locations = {}
        for token in (TOKEN_A, TOKEN_B):
            pc, sdp = await an_offer()
            pcs.append(pc)
            headers = {"Content-Type": "application/sdp", **bearer(token)}
            async with http.post(url + "/whip", data=sdp, headers=headers) as resp:
                assert resp.status == 201
                locations[token] = resp.headers["Location"]

        async def listing(token: str) -> dict[str, list[str]]:
            async with http.get(url + "/debug/sessions", headers=bearer(token)) as resp:
                assert resp.status == 200
                data = await resp.json()
            return {
                part: ["/whip/" + s["session_id"] for s in data[part]]
                for part in ("live", "closed")
            }

        assert await listing(TOKEN_A) == {"live": [locations[TOKEN_A]], "closed": []}
        assert await listing(TOKEN_B) == {"live": [locations[TOKEN_B]], "closed": []}
        for token in (TOKEN_A, TOKEN_B):
            async with http.delete(url + locations[token], headers=bearer(token)) as resp:
                assert resp.status == 200
        assert await listing(TOKEN_A) == {"live": [], "closed": [locations[TOKEN_A]]}
        assert await listing(TOKEN_B) == {"live": [], "closed": [locations[TOKEN_B]]}
    for pc in pcs:
        await pc.close()
