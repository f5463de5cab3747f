"""A call through a TURN relay: coturn on loopback, a client restricted to relay candidates.

The client uses the ICE transport policy "relay" (aiortc/aioice gather no host or reflexive
candidate then), as a browser behind a firewall that only lets TURN out would. The server gets
the same TURN server from its configuration (``transport.ice_*``). Audio must flow both ways
through coturn, and the pair ICE nominated must start at the client's relay candidate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy

from server.client import ClientPeer, ice_configuration
from tests.support.coturn import Coturn, stun_answers
from tests.support.server_process import TONE_PIPELINE, ServerProcess
from tests.support.speech import loud_seconds, silence, speak

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def coturn() -> Iterator[Coturn]:
    turn = Coturn().start()
    yield turn
    turn.stop()


@pytest.fixture(scope="module")
def server(coturn: Coturn) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        {
            "pipeline.factory": TONE_PIPELINE,
            "transport.video": "false",  # audio is enough to show the relay carries media
            "transport.ice_urls": coturn.url,
            "transport.ice_username": coturn.username,
            "transport.ice_credential": coturn.password,
        },
        env={"TONE_PIPELINE_MS": "1500", "TONE_PIPELINE_SENTENCES": "1"},
    ).start()
    yield proc
    assert proc.stop() == 0, proc.log()


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
    coturn: Coturn, server: ServerProcess, peers: list[ClientPeer]
) -> None:
    peer = ClientPeer(server.url, video=False, configuration=relay_only(coturn))
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
    coturn: Coturn, server: ServerProcess, peers: list[ClientPeer]
) -> None:
    """The negative control: without a relay the relay-only client has no path at all."""
    peer = ClientPeer(server.url, video=False, configuration=relay_only(coturn, password="wrong"))
    peers.append(peer)
    with pytest.raises(TimeoutError):
        await peer.connect(timeout=5)
    assert candidate_types(peer.pc.localDescription.sdp) == []
    assert peer.pc.iceConnectionState in ("new", "checking", "failed")
