"""What a hostile client does below the data-channel API: stop acknowledging the server's SCTP
data, send a text message that is not UTF-8, open more ``events`` channels.

These reach into the client's own aiortc objects (private names); the server is untouched.
"""

from __future__ import annotations

from struct import pack

from aiortc import RTCDataChannel
from aiortc.rtcdatachannel import RTCDataChannelParameters
from aiortc.rtcsctptransport import (
    DATA_CHANNEL_OPEN,
    DATA_CHANNEL_RELIABLE,
    WEBRTC_DCEP,
    WEBRTC_STRING,
    RTCSctpTransport,
)

from client.cli import ClientPeer


def _sctp(peer: ClientPeer) -> RTCSctpTransport:
    sctp = peer.pc.sctp
    if sctp is None:
        raise RuntimeError("the peer has no SCTP transport (connect first)")
    return sctp


def stop_acknowledging(peer: ClientPeer) -> None:
    """From now on the peer sends no SCTP SACK: the server's data stays unacknowledged, its
    congestion window stays full and what it sends next queues up on its side. The peer still
    receives (and the server still acknowledges what the peer sends)."""
    sctp = _sctp(peer)

    async def no_sack() -> None:
        sctp._sack_duplicates.clear()
        sctp._sack_needed = False

    sctp._send_sack = no_sack  # type: ignore[method-assign]


async def send_raw_text(
    peer: ClientPeer, data: bytes, channel: RTCDataChannel | None = None
) -> None:
    """Send ``data`` as one text (WebRTC String, PPID 51) message on ``channel`` (default the
    peer's ``events`` channel) without encoding it: it may be invalid UTF-8."""
    sctp = _sctp(peer)
    channel = channel or peer.channel
    channel._addBufferedAmount(len(data))  # the flush subtracts it again
    sctp._data_channel_queue.append((channel, WEBRTC_STRING, data))
    await sctp._data_channel_flush()


async def send_channel_open(peer: ClientPeer, label: bytes, on_open_channel: bool = False) -> None:
    """Send a DCEP DATA_CHANNEL_OPEN whose label is ``label`` (raw bytes, maybe not UTF-8) on
    a new stream, or (``on_open_channel``) again on the stream of the open ``events`` channel."""
    sctp = _sctp(peer)
    if on_open_channel:
        channel = peer.channel
    else:  # a channel object that announces nothing itself: the stream id comes at the flush
        channel = RTCDataChannel(sctp, RTCDataChannelParameters(label="raw"), send_open=False)
    header = pack("!BBHLHH", DATA_CHANNEL_OPEN, DATA_CHANNEL_RELIABLE, 0, 0, len(label), 0)
    sctp._data_channel_queue.append((channel, WEBRTC_DCEP, header + label))
    await sctp._data_channel_flush()
