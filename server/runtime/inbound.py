"""Reading what a remote peer sends: the frames of its tracks (microphone, camera)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError
from av.frame import Frame
from av.packet import Packet


async def frames(track: MediaStreamTrack) -> AsyncIterator[Frame | Packet[Any]]:
    """Every frame a remote track delivers, until the track ends."""
    while True:
        try:
            yield await track.recv()
        except MediaStreamError:
            return
