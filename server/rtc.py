"""aiortc settings the project owns: ICE servers, host candidates, the audio jitter buffer."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtcrtpreceiver import RTCRtpReceiver

from server.config import TransportConfig

log = logging.getLogger(__name__)

_original_host_addresses = aioice.ice.get_host_addresses
AUDIO_JITTER_CAPACITY = 16  # packets (aiortc's own value; a power of two)


def rtc_configuration(config: TransportConfig) -> RTCConfiguration:
    """ICE servers from configuration; an explicit empty list so no public STUN is contacted."""
    if not config.ice_urls:
        return RTCConfiguration(iceServers=[])
    server = RTCIceServer(
        urls=list(config.ice_urls),
        username=config.ice_username or None,
        credential=config.ice_credential or None,
    )
    return RTCConfiguration(iceServers=[server])


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


def tune_audio_jitter(pc: RTCPeerConnection, prefetch: int) -> int:
    """Release inbound audio after ``prefetch`` packets instead of aiortc's 4.

    aiortc has no public option; the receiver's buffer is replaced before media flows (call
    after setRemoteDescription). Returns how many audio receivers were tuned.
    """
    tuned = 0
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            buffer = JitterBuffer(capacity=AUDIO_JITTER_CAPACITY, prefetch=prefetch)
            transceiver.receiver._RTCRtpReceiver__jitter_buffer = buffer  # type: ignore[attr-defined]
            tuned += 1
    return tuned


def audio_jitter_prefetch(receiver: RTCRtpReceiver) -> int:
    """The prefetch (packets) of a receiver's jitter buffer; for tests and diagnostics."""
    buffer: JitterBuffer = receiver._RTCRtpReceiver__jitter_buffer  # type: ignore[attr-defined]
    return int(buffer._prefetch)
