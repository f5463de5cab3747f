"""aiortc settings the project owns: ICE servers, host candidates, the audio jitter buffer,
the DTLS cipher list, trickled remote candidates, which m-line carries our tracks, and the
guard on inbound data-channel messages."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from struct import unpack_from
from typing import Any

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy, RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcdtlstransport import SRTP_AES128_CM_SHA1_80, RTCCertificate
from aiortc.rtcpeerconnection import or_direction
from aiortc.rtcrtpreceiver import RTCRtpReceiver
from aiortc.rtcsctptransport import (
    DATA_CHANNEL_ACK,
    DATA_CHANNEL_OPEN,
    WEBRTC_DCEP,
    WEBRTC_STRING,
    RTCSctpTransport,
)
from aiortc.sdp import candidate_from_sdp
from OpenSSL import SSL

from server.rtc import opus
from server.rtc.ice import IceServer
from server.rtc.jitter import ArrivalBuffer, MediaGuard, PayloadClock
from server.wire.protocol import UndecodableText

log = logging.getLogger(__name__)

_original_host_addresses = aioice.ice.get_host_addresses
_original_ssl_context = RTCCertificate._create_ssl_context

# aiortc offers only ECDSA suites; peers with RSA certificates (GStreamer's webrtcbin, the
# stack behind many WHIP publishers) then fail with "no shared cipher". Forward-secret AEAD
# suites first, then aiortc's own CBC ones, for both certificate kinds.
DTLS_CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
        "ECDHE-ECDSA-AES128-SHA",
        "ECDHE-RSA-AES128-SHA",
        "ECDHE-ECDSA-AES256-SHA",
        "ECDHE-RSA-AES256-SHA",
    )
).encode()


def widen_dtls_ciphers() -> None:
    """Make every aiortc DTLS context (this process) accept RSA as well as ECDSA peers.

    aiortc has no option for it: its certificate builds the SSL context in one method, which
    is wrapped here (idempotent; the project owns this patch point).
    """
    if getattr(RTCCertificate._create_ssl_context, "_widened", False):
        return

    def create_ssl_context(self: RTCCertificate, srtp_profiles: list[Any]) -> SSL.Context:
        ctx = _original_ssl_context(self, srtp_profiles)
        ctx.set_cipher_list(DTLS_CIPHERS)
        return ctx

    create_ssl_context._widened = True  # type: ignore[attr-defined]
    RTCCertificate._create_ssl_context = create_ssl_context  # type: ignore[method-assign]
    log.info("DTLS cipher list widened to ECDSA and RSA suites")


def dtls_cipher_names(certificate: RTCCertificate) -> list[str]:
    """The cipher suites a DTLS connection with ``certificate`` offers; for tests."""
    ctx = certificate._create_ssl_context([SRTP_AES128_CM_SHA1_80])
    return [str(name) for name in SSL.Connection(ctx, None).get_cipher_list()]


def rtc_configuration(servers: Sequence[IceServer], relay_only: bool = False) -> RTCConfiguration:
    """ICE servers for a peer; an explicit empty list so no public STUN is contacted.
    ``relay_only``: gather and use TURN relay candidates only (ICE transport policy "relay")."""
    return RTCConfiguration(
        iceServers=[
            RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
            for s in servers
        ],
        iceTransportPolicy=RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL,
    )


def pin_host_addresses(addresses: Sequence[str]) -> None:
    """Offer only ``addresses`` as host candidates (empty: aioice's own choice).

    aioice reads interfaces in one module-level function; the process has one setting.
    """
    if not addresses:
        aioice.ice.get_host_addresses = _original_host_addresses
        return
    pinned = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in pinned if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses
    log.info("ICE host candidates pinned to %s", ", ".join(pinned))


def tune_audio_receive(pc: RTCPeerConnection, guard: MediaGuard | None = None) -> int:
    """Release inbound audio packets as they arrive (server/rtc/jitter.py), instead of after
    aiortc's 4, and 280 ms late for the rest of the call after a loss; and ask the sender for
    in-band FEC, which the receiver's decoder uses for lost packets (server/rtc/opus.py).
    ``guard``: the session's inbound audio budget, shared by its audio receivers (None: none).

    aiortc has no public option for either; the receiver's buffer and the codecs to answer
    with are replaced before media flows (call after setRemoteDescription, before
    createAnswer). Returns how many audio receivers were tuned.
    """
    opus.install()
    tuned = 0
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            codecs = [opus.receiving_fec(codec) for codec in transceiver._codecs]
            transceiver._codecs = codecs
            asked = (c.payloadType for c in codecs if opus.FEC_PARAMETER in c.parameters)
            clocks = {
                c.payloadType: PayloadClock(c.clockRate, c.mimeType.lower() == "audio/opus")
                for c in codecs
                if c.payloadType is not None
            }
            buffer = ArrivalBuffer(frozenset(pt for pt in asked if pt is not None), guard, clocks)
            transceiver.receiver._RTCRtpReceiver__jitter_buffer = buffer  # type: ignore[attr-defined]
            tuned += 1
    return tuned


def audio_jitter_buffer(receiver: RTCRtpReceiver) -> JitterBuffer:
    """A receiver's jitter buffer; for tests and diagnostics."""
    buffer: JitterBuffer = receiver._RTCRtpReceiver__jitter_buffer  # type: ignore[attr-defined]
    return buffer


def remote_candidates_complete(pc: RTCPeerConnection) -> bool:
    """Whether the remote side already signalled end-of-candidates (offer or trickle)."""
    remote = pc.remoteDescription
    return remote is not None and "a=end-of-candidates" in remote.sdp


async def add_remote_candidates(
    pc: RTCPeerConnection,
    candidates: Sequence[str],
    *,
    mid: str | None,
    mline_index: int,
    end_of_candidates: bool = False,
) -> int:
    """Add trickled remote candidates (``candidate:...`` attribute values) to the transport of
    the media section ``mid`` (or ``mline_index``); bundled sections share the first one's.

    Returns how many candidates were added. ValueError for a candidate aiortc cannot parse.
    """
    added = 0
    for value in candidates:
        try:
            candidate = candidate_from_sdp(value.removeprefix("candidate:"))
        except (AssertionError, IndexError, ValueError) as exc:
            raise ValueError(f"cannot parse candidate {value[:80]!r}") from exc
        candidate.sdpMid = mid
        candidate.sdpMLineIndex = mline_index
        await pc.addIceCandidate(candidate)
        added += 1
    if end_of_candidates:
        await pc.addIceCandidate(None)
    return added


def add_outbound_track(pc: RTCPeerConnection, track: MediaStreamTrack) -> bool:
    """Send ``track`` on the first free transceiver of its kind whose m-line the remote
    offer lets us send on (it offered ``sendrecv`` or ``recvonly``); call after
    setRemoteDescription. False when the peer asked for none of that kind (a publisher).

    aiortc's own ``addTrack`` takes the first transceiver of the kind, which for a client
    with separate ``sendonly`` and ``recvonly`` m-lines is the wrong one: the answer then says
    ``recvonly`` there and ``inactive`` where the client wanted to receive.
    """
    for transceiver in pc.getTransceivers():
        if (
            transceiver.kind == track.kind
            and transceiver.sender.track is None
            and transceiver._offerDirection in ("sendonly", "sendrecv")
        ):
            transceiver.sender.replaceTrack(track)
            transceiver.direction = or_direction(transceiver.direction, "sendonly")
            return True
    return False


DCEP_OPEN_HEADER_BYTES = 12  # RFC 8832: type, channel type, priority, reliability, two lengths


def _dcep_fault(sctp: RTCSctpTransport, stream_id: int, data: bytes) -> str | None:
    """Why aiortc would fail on this DCEP message (raise inside its receive path, which ends
    the transport), or None when it handles it."""
    if not data:
        return None
    if data[0] == DATA_CHANNEL_OPEN and len(data) >= DCEP_OPEN_HEADER_BYTES:
        if stream_id in sctp._data_channels:
            return "an open for a stream that is open"
        label_length, protocol_length = unpack_from("!HH", data, 8)
        end = DCEP_OPEN_HEADER_BYTES + label_length
        try:
            data[DCEP_OPEN_HEADER_BYTES:end].decode("utf8")
            data[end : end + protocol_length].decode("utf8")
        except UnicodeDecodeError:
            return "a label or protocol that is not UTF-8"
    elif data[0] == DATA_CHANNEL_ACK and stream_id not in sctp._data_channels:
        return "an ack for an unknown stream"
    return None


def guard_data_channels(pc: RTCPeerConnection, name: str) -> bool:
    """Keep one malformed inbound data-channel message from ending this peer's SCTP transport.

    aiortc decodes text messages (PPID 51) with ``.decode("utf8")`` and checks DCEP messages
    with ``assert`` inside its receive path; an exception there ends the DTLS transport and
    logs a traceback. This wraps the receive step of this one connection's SCTP transport
    (an instance attribute, nothing global; call after setRemoteDescription): a text message
    that is not UTF-8 reaches the channel's ``message`` handlers as UndecodableText (its raw
    bytes), so the session answers it with one ``error``; a DCEP message aiortc would fail on
    is dropped, and the first one is logged under ``name``. Returns whether a transport was
    guarded (False: the offer had no data channel). Idempotent.
    """
    sctp = pc.sctp
    if sctp is None:
        return False
    if getattr(sctp, "_avatar_guarded", False):
        return True
    receive: Callable[[int, int, bytes], Awaitable[None]] = sctp._data_channel_receive
    dropped = 0

    async def guarded_receive(stream_id: int, pp_id: int, data: bytes) -> None:
        nonlocal dropped
        if pp_id == WEBRTC_STRING:
            try:
                data.decode("utf8")
            except UnicodeDecodeError:
                channel = sctp._data_channels.get(stream_id)
                if channel is not None:
                    channel.emit("message", UndecodableText(data))
                return
        elif pp_id == WEBRTC_DCEP:
            fault = _dcep_fault(sctp, stream_id, data)
            if fault is not None:
                dropped += 1
                if dropped == 1:
                    log.warning(
                        "%s: dropped a data channel control message with %s (further ones "
                        "are dropped without a log line)",
                        name,
                        fault,
                    )
                return
        await receive(stream_id, pp_id, data)

    sctp._data_channel_receive = guarded_receive  # type: ignore[method-assign]
    sctp._avatar_guarded = True  # type: ignore[attr-defined]
    return True
