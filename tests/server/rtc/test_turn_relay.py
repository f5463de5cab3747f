"""A call through a TURN relay: coturn on loopback, a client restricted to relay candidates.

The client uses the ICE transport policy "relay" (aiortc/aioice gather no host or reflexive
candidate then), as a browser behind a firewall that only lets TURN out would. The server gets
the same TURN server from its configuration (``transport.ice_*``). Audio must flow both ways
through coturn, and the pair ICE nominated must start at the client's relay candidate.

Twice: with one static TURN user, and with credentials the server issues per client from a
secret it shares with coturn (``transport.ice_auth_secret``, coturn ``--use-auth-secret``),
which the client fetches from ``GET /ice-servers`` as the web page does.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import aiohttp
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from client.cli import ClientPeer, ice_configuration
from server.config import TransportConfig
from server.rtc.ice import IceServer, ice_servers, rest_credential
from server.rtc.settings import rtc_configuration
from tests.support.coturn import Coturn, stun_answers
from tests.support.peers import Peer
from tests.support.server_process import TONE_PIPELINE, ServerProcess, server_process, tone_env
from tests.support.speech import loud_seconds, silence, speak

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def coturn() -> Iterator[Coturn]:
    turn = Coturn().start()
    yield turn
    turn.stop()


AUDIO_ONLY = {"transport.video": "false"}  # audio is enough to show the relay carries media


def static_ice(coturn: Coturn) -> dict[str, str]:
    return {
        **AUDIO_ONLY,
        "transport.ice_urls": coturn.url,
        "transport.ice_username": coturn.username,
        "transport.ice_credential": coturn.password,
    }


# servers replying with one 1.5 s tone, their ICE settings pointing at a coturn fixture
server = server_process(static_ice, pipeline=TONE_PIPELINE, env=tone_env(1500, sentences=1))


def relay_only(coturn: Coturn, password: str | None = None) -> RTCConfiguration:
    return ice_configuration(
        [coturn.url], coturn.username, password or coturn.password, relay_only=True
    )


def candidate_types(sdp: str) -> list[str]:
    """The ``typ`` of every ``a=candidate`` line of an SDP."""
    types = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            fields = line.split()
            types.append(fields[fields.index("typ") + 1])
    return types


def nominated_pair_types(peer: ClientPeer) -> tuple[str, str]:
    """(local, remote) candidate types of the pair aioice nominated (all media is bundled)."""
    connection = peer.pc.sctp.transport.transport._connection  # type: ignore[union-attr]
    pairs = list(connection._nominated.values())
    assert len(pairs) == 1, pairs
    pair = pairs[0]
    return str(pair.local_candidate.type), str(pair.remote_candidate.type)


def test_coturn_answers_stun(coturn: Coturn) -> None:
    assert stun_answers(coturn.host, coturn.port)


def test_relay_only_needs_a_turn_server() -> None:
    with pytest.raises(ValueError, match="TURN"):
        ice_configuration(["stun:127.0.0.1:3478"], None, None, relay_only=True)
    config = ice_configuration([], None, None, relay_only=False)
    assert config.iceServers == [] and config.iceTransportPolicy is RTCIceTransportPolicy.ALL
    # what --relay-only builds: aiortc's own relay policy with one TURN server
    config = ice_configuration(["turn:t.example:3478"], "u", "p", relay_only=True)
    assert config.iceTransportPolicy is RTCIceTransportPolicy.RELAY
    assert config.iceServers == [
        RTCIceServer(urls=["turn:t.example:3478"], username="u", credential="p")
    ]


async def test_relay_only_call_carries_audio_both_ways(
    coturn: Coturn, server: ServerProcess, peers: list[Peer]
) -> None:
    peer = Peer(server.url, video=False, configuration=relay_only(coturn))
    peers.append(peer)
    started = time.monotonic()
    await peer.connect(timeout=20)
    connect_ms = (time.monotonic() - started) * 1000
    # the client offered relay candidates only: the call can go nowhere but through coturn
    offered = candidate_types(peer.pc.localDescription.sdp)
    assert offered and set(offered) == {"relay"}, offered
    local, remote = nominated_pair_types(peer)
    assert local == "relay"
    await peer.wait_event("session.created")
    # client -> server: the server's VAD hears the question; server -> client: the reply tone
    peer.mic.play(np.concatenate([silence(300), speak("Hello there, can you hear me?")]))
    await peer.wait_event("input_audio_buffer.speech_started", timeout=15)
    await peer.wait_event("response.created", timeout=20)
    done = await peer.wait_event("response.done", timeout=20)
    assert done["status"] == "completed"
    await asyncio.sleep(0.5)  # the last packets and the client's jitter buffer
    loud_s = loud_seconds(peer.received_audio())
    assert 1.0 <= loud_s <= 1.6, f"{loud_s:.2f} s of the 1.5 s reply tone arrived"
    # coturn's side of it: our user allocated a relay and bound a channel to a peer
    log = coturn.log()
    assert f"user <{coturn.username}>: incoming packet ALLOCATE processed, success" in log
    assert "CHANNEL_BIND processed, success" in log
    print(f"TURN relay: connected in {connect_ms:.0f} ms, pair {local} -> {remote}")


async def test_wrong_turn_password_gets_no_relay_and_no_call(
    coturn: Coturn, server: ServerProcess, peers: list[Peer]
) -> None:
    """The negative control: without a relay the relay-only client has no path at all."""
    peer = Peer(server.url, video=False, configuration=relay_only(coturn, password="wrong"))
    peers.append(peer)
    with pytest.raises(TimeoutError):
        await peer.connect(timeout=5)
    assert candidate_types(peer.pc.localDescription.sdp) == []
    assert peer.pc.iceConnectionState in ("new", "checking", "failed")


# --- issued, short-lived credentials (TURN REST API) --------------------------------------------
TURN_SECRET = "shared-with-coturn-only"


@pytest.fixture(scope="module")
def rest_coturn() -> Iterator[Coturn]:
    turn = Coturn(auth_secret=TURN_SECRET, relay_ports=(49210, 49250)).start()  # its own range
    yield turn
    turn.stop()


def issued_ice(rest_coturn: Coturn) -> dict[str, str]:
    return {
        **AUDIO_ONLY,
        "transport.ice_urls": rest_coturn.url,
        "transport.ice_auth_secret": TURN_SECRET,
    }


rest_server = server_process(issued_ice, pipeline=TONE_PIPELINE, env=tone_env(1500, sentences=1))


async def test_issued_turn_credentials_carry_a_relay_only_call(
    rest_coturn: Coturn, rest_server: ServerProcess, peers: list[Peer]
) -> None:
    async with aiohttp.ClientSession() as http, http.get(rest_server.url + "/ice-servers") as resp:
        assert resp.status == 200
        (given,) = (await resp.json())["iceServers"]
    turn = IceServer(tuple(given["urls"]), given["username"], given["credential"])
    expiry, label = str(turn.username).split(":")
    assert turn.urls == (rest_coturn.url,) and label == "client"
    assert int(expiry) > time.time() + 3.9 * 3600  # the default lifetime is four hours
    peer = Peer(
        rest_server.url, video=False, configuration=rtc_configuration([turn], relay_only=True)
    )
    peers.append(peer)
    started = time.monotonic()
    await peer.connect(timeout=20)
    connect_ms = (time.monotonic() - started) * 1000
    assert set(candidate_types(peer.pc.localDescription.sdp)) == {"relay"}
    local, remote = nominated_pair_types(peer)
    assert local == "relay"
    peer.send({"type": "conversation.item.create", "text": "Are you there?"})
    done = await peer.wait_event("response.done", timeout=20)
    assert done["status"] == "completed"
    await asyncio.sleep(0.5)
    assert 1.0 <= loud_seconds(peer.received_audio()) <= 1.6
    # coturn took both issued credentials: the client's, and the server's own for its relay
    log = rest_coturn.log()
    assert f"user <{turn.username}>: incoming packet ALLOCATE processed, success" in log
    label = re.escape(f"server-{str(peer.session_id)[:8]}")
    own = rf"user <\d+:{label}>: incoming packet ALLOCATE processed, success"
    assert re.search(own, log), "the server allocated no relay under its issued name"
    print(f"TURN relay, issued credentials: connected in {connect_ms:.0f} ms, {local} -> {remote}")


async def test_expired_or_forged_turn_credentials_get_no_relay(
    rest_coturn: Coturn, rest_server: ServerProcess, peers: list[Peer]
) -> None:
    config = TransportConfig(
        ice_urls=(rest_coturn.url,), ice_auth_secret=TURN_SECRET, ice_credential_ttl_s=60
    )
    (expired,) = ice_servers(config, time.time() - 3600, "client")
    username = f"{int(time.time()) + 3600}:client"
    forged = IceServer(expired.urls, username, rest_credential("a-guessed-secret", username))
    for turn in (expired, forged):
        peer = Peer(
            rest_server.url, video=False, configuration=rtc_configuration([turn], relay_only=True)
        )
        peers.append(peer)
        with pytest.raises(TimeoutError):
            await peer.connect(timeout=5)
        assert candidate_types(peer.pc.localDescription.sdp) == [], turn
