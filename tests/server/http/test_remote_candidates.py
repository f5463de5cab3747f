"""The server contacts only the remote ICE candidates it should, and only so many: a cap on the
distinct candidates of a session (offer and trickle PATCHes together), a rate limit on PATCH,
and no candidates more local than the client itself (``transport.private_candidates``).

What reaches aiortc is read from the server peer's ICE transport (its remote candidates are
what it sends STUN checks to). The clients are named by a trusted proxy's ``X-Forwarded-For``.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from server.http.signaling import REGISTRY_KEY
from server.http.whip import SDPFRAG_TYPE
from tests.support.in_process import running
from tests.support.offers import first_mid, host_candidate, trickle_offer, with_candidates

SDP = {"Content-Type": "application/sdp"}
TRUSTED = {"server.trusted_proxies": "127.0.0.1"}
PUBLIC_CLIENT = "1.2.3.4"  # a global address, as the proxy names it
LAN_CLIENT = "192.168.1.7"
# one of each kind a client may name: (host, on the public internet)
ADDRESSES = [
    ("127.0.0.1", False),
    ("10.1.2.3", False),
    ("192.168.1.20", False),
    ("169.254.7.7", False),
    ("fe80::1", False),
    ("fd00::5", False),
    ("100.64.0.9", False),  # carrier-grade NAT
    ("0a1b2c3d-1111-2222-3333-444455556666.local", False),  # mDNS
    ("1.2.3.5", True),
    ("2a00:1450::1", True),
]


def remote_candidates(app: web.Application, session_id: str) -> set[tuple[str, int]]:
    """(address, port) of every remote candidate the server peer's ICE has."""
    pc = app[REGISTRY_KEY].get(session_id).pc
    transport = pc.getTransceivers()[0].receiver.transport.transport
    return {(c.ip, c.port) for c in transport.getRemoteCandidates()}


async def create(
    http: aiohttp.ClientSession, url: str, offer: str, client: str = ""
) -> tuple[int, dict[str, Any], str]:
    """POST /whip: (status, JSON error or {}, session id or '')."""
    headers = {**SDP, **({"X-Forwarded-For": client} if client else {})}
    async with http.post(url + "/whip", data=offer, headers=headers) as resp:
        body = await resp.json() if resp.content_type == "application/json" else {}
        return resp.status, body, resp.headers.get("Location", "").rsplit("/", 1)[-1]


async def patch(
    http: aiohttp.ClientSession,
    url: str,
    session_id: str,
    mid: str,
    candidates: list[str],
    client: str = "",
) -> tuple[int, dict[str, Any]]:
    lines = ["m=audio 9 UDP/TLS/RTP/SAVPF 0", f"a=mid:{mid}", *(f"a={c}" for c in candidates)]
    headers = {"Content-Type": SDPFRAG_TYPE, **({"X-Forwarded-For": client} if client else {})}
    body = "\r\n".join(lines) + "\r\n"
    async with http.patch(f"{url}/whip/{session_id}", data=body, headers=headers) as resp:
        if resp.status == 429:
            assert int(resp.headers["Retry-After"]) >= 1
        return resp.status, (await resp.json() if resp.content_type == "application/json" else {})


def spray(count: int, first_port: int, address: str = "127.0.0.1") -> list[str]:
    return [host_candidate(address, first_port + i, f"s{first_port + i}") for i in range(count)]


async def test_the_issues_candidate_spray_is_refused_and_changes_nothing() -> None:
    """5 PATCHes of 150 candidates: before, all 750 reached aiortc (1,700 STUN packets to 467
    ports in 10 s); now each PATCH is over the session's cap and refused whole."""
    offer = await trickle_offer()
    mid = first_mid(offer)
    async with running() as (url, app), aiohttp.ClientSession() as http:
        status, _, sid = await create(http, url, offer)
        assert status == 201
        answers = [await patch(http, url, sid, mid, spray(150, 40000 + 150 * p)) for p in range(5)]
        assert [(s, body["code"]) for s, body in answers] == [(422, "too_many_candidates")] * 5
        assert "at most 32" in answers[0][1]["error"]
        assert remote_candidates(app, sid) == set()


async def test_candidates_are_capped_across_patches_and_the_offer() -> None:
    offer = await trickle_offer()
    mid = first_mid(offer)
    settings = {"transport.max_remote_candidates": "8"}
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        # the offer's own candidates count too, and an offer over the cap makes no session
        status, body, _ = await create(http, url, with_candidates(offer, spray(9, 41000)))
        assert (status, body["code"]) == (422, "too_many_candidates")
        assert len(app[REGISTRY_KEY]) == 0
        status, _, sid = await create(http, url, with_candidates(offer, spray(3, 42000)))
        assert status == 201 and len(remote_candidates(app, sid)) == 3
        assert (await patch(http, url, sid, mid, spray(4, 43000)))[0] == 204
        assert len(remote_candidates(app, sid)) == 7
        # one more would be 8; two more are 9: refused whole, nothing added
        status, body = await patch(http, url, sid, mid, spray(2, 44000))
        assert (status, body["code"]) == (422, "too_many_candidates")
        assert len(remote_candidates(app, sid)) == 7
        # candidates the session already has are not new
        assert (await patch(http, url, sid, mid, spray(4, 43000) + spray(1, 44000)))[0] == 204
        assert len(remote_candidates(app, sid)) == 8


async def test_patch_is_rate_limited_per_session() -> None:
    offer = await trickle_offer()
    mid = first_mid(offer)
    settings = {"transport.patch_burst": "3", "transport.patch_rate_per_min": "1"}
    async with running(settings) as (url, app), aiohttp.ClientSession() as http:
        _, _, first = await create(http, url, offer)
        _, _, second = await create(http, url, offer)
        answers = [await patch(http, url, first, mid, spray(1, 45000 + i)) for i in range(4)]
        assert [s for s, _ in answers] == [204, 204, 204, 429]
        assert answers[3][1]["code"] == "rate_limited"
        assert len(remote_candidates(app, first)) == 3  # the refused one added nothing
        assert (await patch(http, url, second, mid, spray(1, 46000)))[0] == 204  # its own bucket


async def test_a_public_client_cannot_point_the_server_at_private_addresses() -> None:
    """Candidates more local than the client are dropped before aiortc sees them (in the offer
    and in PATCHes): a client on the internet can name only global addresses."""
    offer = await trickle_offer()
    mid = first_mid(offer)
    candidates = [host_candidate(a, 47000 + i, f"p{i}") for i, (a, _) in enumerate(ADDRESSES)]
    public = {(a, 47000 + i) for i, (a, ok) in enumerate(ADDRESSES) if ok}
    async with running(TRUSTED) as (url, app), aiohttp.ClientSession() as http:
        status, _, sid = await create(http, url, with_candidates(offer, candidates), PUBLIC_CLIENT)
        assert status == 201
        assert remote_candidates(app, sid) == public
        _, _, sid = await create(http, url, offer, PUBLIC_CLIENT)
        assert (await patch(http, url, sid, mid, candidates, PUBLIC_CLIENT))[0] == 204
        assert remote_candidates(app, sid) == public
        # a client on the LAN may name LAN addresses (not this machine's loopback)
        _, _, sid = await create(http, url, offer, LAN_CLIENT)
        assert (await patch(http, url, sid, mid, candidates, LAN_CLIENT))[0] == 204
        lan = {(a, p) for a, p in remote_candidates(app, sid)}
        assert ("192.168.1.20", 47002) in lan and ("1.2.3.5", 47008) in lan
        assert not {a for a, _ in lan} & {"127.0.0.1", "169.254.7.7", "fe80::1"}
    # private_candidates=drop: nobody may; allow: anybody may (aiortc leaves mDNS unresolved)
    drop = {**TRUSTED, "transport.private_candidates": "drop"}
    async with running(drop) as (url, app), aiohttp.ClientSession() as http:
        _, _, sid = await create(http, url, offer, LAN_CLIENT)
        assert (await patch(http, url, sid, mid, candidates, LAN_CLIENT))[0] == 204
        assert remote_candidates(app, sid) == public
    allow = {**TRUSTED, "transport.private_candidates": "allow"}
    async with running(allow) as (url, app), aiohttp.ClientSession() as http:
        _, _, sid = await create(http, url, offer, PUBLIC_CLIENT)
        assert (await patch(http, url, sid, mid, candidates, PUBLIC_CLIENT))[0] == 204
        assert ("127.0.0.1", 47000) in remote_candidates(app, sid)
        assert len(remote_candidates(app, sid)) >= len(ADDRESSES) - 1


async def test_behind_a_proxy_range_a_client_cannot_claim_the_lan() -> None:
    """SECURITY.md: ``trusted_proxies`` took exact strings only (the Kubernetes manifest's
    ``10.0.0.0/8`` never matched), so behind the proxy every internet client was a LAN client
    to this filter; and a client's own ``X-Forwarded-For`` line was read first."""
    offer = await trickle_offer()
    mid = first_mid(offer)
    candidates = [host_candidate(a, 47000 + i, f"p{i}") for i, (a, _) in enumerate(ADDRESSES)]
    public = {(a, 47000 + i) for i, (a, ok) in enumerate(ADDRESSES) if ok}
    in_range = {"server.trusted_proxies": "127.0.0.0/8"}
    forged = [("X-Forwarded-For", LAN_CLIENT), ("X-Forwarded-For", PUBLIC_CLIENT)]
    async with running(in_range) as (url, app), aiohttp.ClientSession() as http:
        headers = CIMultiDict([("Content-Type", SDP["Content-Type"]), *forged])
        body = with_candidates(offer, candidates)
        async with http.post(url + "/whip", data=body, headers=headers) as resp:
            assert resp.status == 201
            sid = resp.headers["Location"].rsplit("/", 1)[-1]
        assert remote_candidates(app, sid) == public
        _, _, sid = await create(http, url, offer, LAN_CLIENT)  # a LAN client, named by it
        assert (await patch(http, url, sid, mid, candidates, LAN_CLIENT))[0] == 204
        assert ("192.168.1.20", 47002) in remote_candidates(app, sid)


async def test_never_multicast_broadcast_unspecified_or_dns_names() -> None:
    offer = await trickle_offer()
    mid = first_mid(offer)
    odd = ["224.0.0.251", "255.255.255.255", "0.0.0.0", "::", "ff02::1", "turn.example.net"]
    allow = {"transport.private_candidates": "allow"}
    async with running(allow) as (url, app), aiohttp.ClientSession() as http:
        _, _, sid = await create(http, url, offer)
        candidates = [host_candidate(a, 48000 + i, f"o{i}") for i, a in enumerate(odd)]
        assert (await patch(http, url, sid, mid, candidates))[0] == 204
        assert remote_candidates(app, sid) == set()
