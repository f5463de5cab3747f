"""WHIP (RFC 9725) as a client relies on it: 201 + Location + ETag, Link, OPTIONS, trickle ICE
through PATCH (an aiortc client that sends its candidates after the answer), ICE restarts
refused with 422, If-Match, DELETE freeing everything; plus the pure parts (fragments, tags)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription, VideoStreamTrack
from aiortc.rtcdtlstransport import RTCCertificate

from client.cli import ScriptedMic
from server.config import TransportConfig, load_config
from server.errors import BadRequest, PayloadTooLarge
from server.http.app import create_app
from server.http.registry import SessionRegistry
from server.http.signaling import REGISTRY_KEY
from server.http.whip import (
    SDPFRAG_TYPE,
    CandidateBudget,
    CandidateFilter,
    Scope,
    TooManyCandidates,
    address_scope,
    entity_tag,
    filter_offer,
    ice_server_links,
    if_match_allows,
    is_ice_restart,
    parse_sdpfrag,
)
from server.pipeline.wiring import detector_factory
from server.rtc.ice import ice_servers
from server.rtc.peer import PeerSession, PeerState
from server.rtc.settings import DTLS_CIPHERS, add_outbound_track, dtls_cipher_names
from tests.support.in_process import running
from tests.support.offers import first_mid, sdpfrag, without_candidates
from tests.support.pace import within
from tests.support.peers import Peer

CANDIDATE = "candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host"


# --- the pure parts ---------------------------------------------------------------------------
def test_sdpfrag_parses_credentials_sections_and_candidates() -> None:
    text = (
        "a=ice-ufrag:EsAw\r\na=ice-pwd:P2uYro0UCOQ4zxjKXaWCBui1\r\n"
        "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:0\r\n"
        f"a={CANDIDATE}\r\na=candidate:2 1 UDP 1694498815 192.0.2.3 61665 typ srflx "
        "raddr 10.0.1.1 rport 8998\r\na=end-of-candidates\r\n"
    )
    fragment = parse_sdpfrag(text, max_lines=100)
    assert (fragment.ufrag, fragment.pwd) == ("EsAw", "P2uYro0UCOQ4zxjKXaWCBui1")
    (media,) = fragment.media
    assert media.mid == "0" and media.mline_index == 0 and media.end_of_candidates
    assert media.candidates[0] == CANDIDATE and fragment.candidate_count == 2
    # candidates before any m= line belong to the first section
    bare = parse_sdpfrag(f"a={CANDIDATE}\n", max_lines=10)
    assert bare.media[0].mid is None and bare.media[0].candidates == (CANDIDATE,)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("hello\n", BadRequest),
        ("a=candidate:1 1 udp 1 127.0.0.1 notaport typ host\n", BadRequest),
        ("a=candidate:1 1 sctp 1 127.0.0.1 5000 typ host\n", BadRequest),
        ("a=candidate:1 1 udp 1\n", BadRequest),
        ("a=ice-ufrag:a\na=ice-ufrag:b\n", BadRequest),
        ("a=end-of-candidates\n" * 51, PayloadTooLarge),
    ],
)
def test_sdpfrag_rejects_malformed_fragments(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_sdpfrag(text, max_lines=50)


def test_entity_tags_if_match_and_restart_detection() -> None:
    tag = entity_tag("session", "ufrag")
    assert tag.startswith('"') and tag.endswith('"') and tag == entity_tag("session", "ufrag")
    assert tag != entity_tag("session", "other")
    assert if_match_allows(None, tag) and if_match_allows("*", tag)
    assert if_match_allows(f'"x", {tag}', tag) and not if_match_allows('"x"', tag)
    fragment = parse_sdpfrag("a=ice-ufrag:new\na=ice-pwd:pw\n", 10)
    assert is_ice_restart(fragment, "old") and not is_ice_restart(fragment, "new")
    assert not is_ice_restart(parse_sdpfrag(f"a={CANDIDATE}\n", 10), "old")


def test_ice_servers_become_link_headers() -> None:
    config = TransportConfig(
        ice_urls=("stun:stun.example.net", "turn:turn.example.net?transport=udp"),
        ice_username="user",
        ice_credential='pa"ss',
    )
    assert ice_server_links(ice_servers(config, 0, "client")) == [
        '<stun:stun.example.net>; rel="ice-server"',
        '<turn:turn.example.net?transport=udp>; rel="ice-server"; username="user"; '
        'credential="pa\\"ss"; credential-type="password"',
    ]
    assert ice_server_links(ice_servers(TransportConfig(), 0, "client")) == []


@pytest.mark.parametrize(
    ("host", "scope"),
    [
        ("127.0.0.1", Scope.LOOPBACK),
        ("::1", Scope.LOOPBACK),
        ("::ffff:127.0.0.1", Scope.LOOPBACK),
        ("169.254.1.1", Scope.LINK_LOCAL),
        ("fe80::1%eth0", Scope.LINK_LOCAL),
        ("10.0.0.1", Scope.PRIVATE),
        ("172.16.5.4", Scope.PRIVATE),
        ("192.168.0.1", Scope.PRIVATE),
        ("100.64.0.1", Scope.PRIVATE),
        ("fd12::1", Scope.PRIVATE),
        ("192.0.2.1", Scope.PRIVATE),  # documentation: reaches nobody public
        ("1.2.3.4", Scope.GLOBAL),
        ("2a00:1450::1", Scope.GLOBAL),
        ("224.0.0.1", None),
        ("ff02::1", None),
        ("255.255.255.255", None),
        ("0.0.0.0", None),
        ("::", None),
        ("240.0.0.1", None),
        ("host.example", None),
        ("abc.local", None),
    ],
)
def test_address_scopes(host: str, scope: Scope | None) -> None:
    assert address_scope(host) == scope


def test_candidate_filter_follows_the_policy_and_the_clients_own_scope() -> None:
    def allowed(policy: str, client: str) -> list[str]:
        hosts = ["127.0.0.1", "fe80::1", "10.0.0.1", "x.local", "1.2.3.4", "224.0.0.1", "a.b"]
        flt = CandidateFilter.for_client(policy, client)
        return [h for h in hosts if flt.allows(f"candidate:1 1 udp 1 {h} 5000 typ host")]

    everything = ["127.0.0.1", "fe80::1", "10.0.0.1", "x.local", "1.2.3.4"]
    assert allowed("allow", "1.2.3.9") == everything
    assert allowed("drop", "127.0.0.1") == ["1.2.3.4"]
    assert allowed("auto", "127.0.0.1") == everything  # on this machine: as local as it gets
    assert allowed("auto", "::1") == everything
    assert allowed("auto", "192.168.1.7") == ["10.0.0.1", "x.local", "1.2.3.4"]
    assert allowed("auto", "1.2.3.9") == ["1.2.3.4"]
    assert allowed("auto", "unknown") == ["1.2.3.4"]


def test_offer_candidates_are_filtered_before_aiortc_and_budgeted() -> None:
    sdp = (
        "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:0\r\n"
        "a=candidate:1 1 udp 5 10.0.0.1 5000 typ host\r\n"
        "a=candidate:2 1 udp 5 1.2.3.4 5000 typ host\r\na=end-of-candidates\r\n"
        "m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:1\r\n"
        "a=candidate:2 1 udp 5 1.2.3.4 5000 typ host\r\n"
    )
    kept_sdp, kept = filter_offer(sdp, CandidateFilter(Scope.GLOBAL))
    assert "10.0.0.1" not in kept_sdp and kept_sdp.count("1.2.3.4") == 2
    assert "a=end-of-candidates" in kept_sdp and kept_sdp.endswith("\r\n")
    assert kept == ("candidate:2 1 udp 5 1.2.3.4 5000 typ host",) * 2
    assert filter_offer(sdp, CandidateFilter(Scope.LOOPBACK))[0] == sdp
    with pytest.raises(BadRequest):
        filter_offer(sdp.replace("5000 typ", "port typ"), CandidateFilter(Scope.LOOPBACK))
    budget = CandidateBudget(2)
    budget.admit(kept)  # the same candidate in two bundled sections: one
    assert len(budget) == 1
    with pytest.raises(TooManyCandidates) as refused:
        budget.admit([CANDIDATE, "candidate:3 1 udp 5 1.2.3.5 5000 typ host"])
    assert refused.value.status == 422 and "at most 2" in refused.value.message
    assert len(budget) == 1  # a refusal changes nothing
    budget.admit([CANDIDATE, "candidate:9 1 UDP 7 1.2.3.4 5000 typ host"])
    assert len(budget) == 2


# --- a real server in this process ------------------------------------------------------------
def registry(app: web.Application) -> SessionRegistry:
    return app[REGISTRY_KEY]


class TrickleClient:
    """An aiortc publisher that POSTs its offer without candidates and trickles them after the
    answer with PATCH (RFC 9725 section 4.3.1)."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("events")
        self.mic = ScriptedMic()
        self.pc.addTrack(self.mic)
        self.events: list[str] = []
        self.connected = asyncio.Event()
        self.channel.on("message", self.events.append)
        self.pc.on("connectionstatechange", self._state)
        self.candidates: list[str] = []
        self.ufrag = self.pwd = self.mid = ""

    def _state(self) -> None:
        if self.pc.connectionState == "connected":
            self.connected.set()

    async def offer_without_candidates(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sdp = self.pc.localDescription.sdp
        offer, self.candidates, self.ufrag, self.pwd = without_candidates(sdp)
        self.mid = first_mid(sdp)
        assert self.candidates, "aiortc gathered no candidate"
        return offer

    def fragment(self, lines: list[str], ufrag: str | None = None) -> str:
        return sdpfrag(ufrag or self.ufrag, self.pwd, self.mid, lines)

    async def close(self) -> None:
        self.mic.stop()
        await self.pc.close()


async def patch(
    http: aiohttp.ClientSession,
    url: str,
    body: str,
    if_match: str | None = None,
    content_type: str = SDPFRAG_TYPE,
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": content_type}
    if if_match is not None:
        headers["If-Match"] = if_match
    async with http.patch(url, data=body, headers=headers) as resp:
        body_json = await resp.json() if resp.content_type == "application/json" else {}
        return resp.status, body_json


async def test_whip_post_answers_201_with_location_etag_and_sdp() -> None:
    async with running() as (url, app):
        peer = Peer(url, whip=True, video=False)
        started = time.monotonic()
        try:
            await peer.connect()
            connect_ms = (time.monotonic() - started) * 1000
            print(f"aiortc WHIP client (full offer): data channel open {connect_ms:.0f} ms")
            assert peer.location is not None and peer.location.startswith("/whip/")
            async with aiohttp.ClientSession() as http:
                offer = peer.pc.localDescription.sdp
                headers = {"Content-Type": "application/sdp"}
                async with http.post(url + "/whip", data=offer, headers=headers) as resp:
                    assert resp.status == 201
                    assert resp.content_type == "application/sdp"
                    assert (await resp.text()).startswith("v=0")
                    location = resp.headers["Location"]
                    assert location.startswith("/whip/") and location != peer.location
                    etag = resp.headers["ETag"]
                    assert etag.startswith('"') and resp.headers["Accept-Patch"] == SDPFRAG_TYPE
                    assert "Link" not in resp.headers  # no ICE servers configured
                async with http.delete(url + location) as resp:
                    assert resp.status == 200
        finally:
            await peer.close()
        assert len(registry(app)) == 0


async def test_options_name_methods_and_advertise_ice_servers() -> None:
    settings = {
        "transport.ice_urls": "stun:127.0.0.1:3478,turn:127.0.0.1:3478",
        "transport.ice_username": "u",
        "transport.ice_credential": "p",
    }
    async with running(settings) as (url, _), aiohttp.ClientSession() as http:
        async with http.options(url + "/whip") as resp:
            assert resp.status == 204
            assert set(resp.headers["Allow"].replace(" ", "").split(",")) >= {"POST", "OPTIONS"}
            links = resp.headers.getall("Link")
            assert links[0] == '<stun:127.0.0.1:3478>; rel="ice-server"'
            assert 'username="u"' in links[1] and 'credential="p"' in links[1]
        async with http.options(url + "/whip/anything") as resp:
            assert resp.status == 204
            allowed = set(resp.headers["Allow"].replace(" ", "").split(","))
            assert allowed >= {"PATCH", "DELETE", "OPTIONS"}
            assert resp.headers["Accept-Patch"] == SDPFRAG_TYPE
        async with http.put(url + "/whip/anything") as resp:
            assert resp.status == 405 and "PATCH" in resp.headers["Allow"]
            assert (await resp.json())["error"]


async def test_trickle_candidates_after_the_answer_connect_the_session() -> None:
    async with running() as (url, app), aiohttp.ClientSession() as http:
        client = TrickleClient()
        try:
            offer = await client.offer_without_candidates()
            started = time.monotonic()
            headers = {"Content-Type": "application/sdp"}
            async with http.post(url + "/whip", data=offer, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
                location, etag = resp.headers["Location"], resp.headers["ETag"]
                answer = await resp.text()
            session_id = location.rsplit("/", 1)[-1]
            server_pc = registry(app).get(session_id).pc
            transport = server_pc.getTransceivers()[0].receiver.transport.transport
            assert transport.getRemoteCandidates() == []  # nothing known before the PATCH
            await client.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            lines = [f"a={c}" for c in client.candidates]
            assert await patch(http, url + location, client.fragment(lines), etag) == (204, {})
            remote = {(c.ip, c.port) for c in transport.getRemoteCandidates()}
            for candidate in client.candidates:
                bits = candidate.split()
                assert (bits[4], int(bits[5])) in remote
            status, _ = await patch(http, url + location, client.fragment(["a=end-of-candidates"]))
            assert status == 204
            await asyncio.wait_for(client.connected.wait(), within(10))
            print(f"aiortc trickle client: connected {(time.monotonic() - started) * 1000:.0f} ms")
            deadline = time.monotonic() + within(10)
            while not any("session.created" in e for e in client.events):
                assert time.monotonic() < deadline, "no session.created on the events channel"
                await asyncio.sleep(0.05)
            # after end-of-candidates no more candidates are taken
            status, body = await patch(http, url + location, client.fragment([f"a={CANDIDATE}"]))
            assert status == 422 and "end-of-candidates" in body["error"]
        finally:
            await client.close()


async def test_patch_errors_change_nothing() -> None:
    async with running() as (url, app), aiohttp.ClientSession() as http:
        client = TrickleClient()
        try:
            offer = await client.offer_without_candidates()
            headers = {"Content-Type": "application/sdp"}
            async with http.post(url + "/whip", data=offer, headers=headers) as resp:
                location, etag = resp.headers["Location"], resp.headers["ETag"]
            session_id = location.rsplit("/", 1)[-1]
            server_pc = registry(app).get(session_id).pc
            transport = server_pc.getTransceivers()[0].receiver.transport.transport
            good = client.fragment([f"a={CANDIDATE}"])
            # a stale entity-tag
            status, body = await patch(http, url + location, good, '"stale"')
            assert status == 412 and body["code"] == "precondition_failed"
            # an ICE restart (new credentials, If-Match: *): refused, the session lives on
            restart = client.fragment([f"a={CANDIDATE}"], ufrag="newUfrag")
            status, body = await patch(http, url + location, restart, "*")
            assert status == 422 and "ICE restart" in body["error"]
            # wrong type, malformed candidate, unknown mid, unknown resource, no body
            text = "text/plain"
            assert (await patch(http, url + location, good, etag, content_type=text))[0] == 415
            bad = client.fragment(["a=candidate:1 1 udp 5 127.0.0.1 x typ host"])
            assert (await patch(http, url + location, bad, etag))[0] == 400
            wrong_mid = good.replace(f"a=mid:{client.mid}", "a=mid:nope")
            assert (await patch(http, url + location, wrong_mid, etag))[0] == 400
            assert (await patch(http, url + "/whip/unknown", good, etag))[0] == 404
            assert transport.getRemoteCandidates() == []  # none of them added anything
            assert registry(app).get(session_id).state is PeerState.NEW
        finally:
            await client.close()


async def test_delete_ends_the_session_and_frees_everything() -> None:
    async with running() as (url, app):
        peer = Peer(url, whip=True, video=False)
        try:
            await peer.connect()
            assert peer.location is not None
            server_peer: PeerSession = registry(app).get(peer.location.rsplit("/", 1)[-1])
            tasks_before = len(asyncio.all_tasks())
            async with aiohttp.ClientSession() as http:
                async with http.delete(url + peer.location) as resp:
                    assert resp.status == 200
                async with http.delete(url + peer.location) as resp:
                    assert resp.status == 404
                    assert (await resp.json())["code"] == "not_found"
            assert len(registry(app)) == 0
            assert server_peer.state is PeerState.CLOSED
            assert server_peer.pc.connectionState == "closed"
            assert not [t for t in server_peer.tasks if not t.done()]
            assert len(asyncio.all_tasks()) < tasks_before
        finally:
            await peer.close(delete=False)


def test_dtls_cipher_list_offers_rsa_suites_once_the_app_exists() -> None:
    config = load_config(overrides={"pipeline.factory": ""})
    create_app(config, detector_factory(config))
    names = dtls_cipher_names(RTCCertificate.generateCertificate())
    assert "ECDHE-RSA-AES128-GCM-SHA256" in names  # GStreamer's webrtcbin has RSA certificates
    assert "ECDHE-ECDSA-AES128-GCM-SHA256" in names  # aiortc's and browsers' ECDSA ones
    assert [n for n in names if n.startswith("ECDHE")] == DTLS_CIPHERS.decode().split(":")


def directions(sdp: str) -> list[str]:
    out: list[str] = []
    for line in sdp.splitlines():
        if line.startswith("m="):
            out.append(line[2:].split()[0])
        elif out and line[2:] in ("sendrecv", "sendonly", "recvonly", "inactive"):
            out[-1] += ":" + line[2:]
    return out


async def test_outbound_tracks_go_where_the_client_asked_to_receive() -> None:
    """A publisher with separate send-only and receive-only m-lines (GStreamer, OBS-style)
    gets the server's tracks on the receive-only ones; a pure publisher gets none."""
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    server = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    publisher = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mics = [ScriptedMic() for _ in range(4)]
    try:
        client.addTransceiver(mics[0], direction="sendonly")
        client.addTransceiver("audio", direction="recvonly")
        client.addTransceiver("video", direction="recvonly")
        await client.setLocalDescription(await client.createOffer())
        await server.setRemoteDescription(client.localDescription)
        assert add_outbound_track(server, mics[1])
        assert add_outbound_track(server, VideoStreamTrack())
        await server.setLocalDescription(await server.createAnswer())
        answer = directions(server.localDescription.sdp)
        assert answer == ["audio:recvonly", "audio:sendonly", "video:sendonly"]
        publisher.addTransceiver(mics[2], direction="sendonly")
        await publisher.setLocalDescription(await publisher.createOffer())
        other = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        await other.setRemoteDescription(publisher.localDescription)
        assert not add_outbound_track(other, mics[3])  # it asked for nothing back
        await other.close()
    finally:
        for mic in mics:
            mic.stop()
        for pc in (client, server, publisher):
            await pc.close()
