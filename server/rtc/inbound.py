"""Reading what a remote peer sends: the frames of its tracks (microphone, camera), and the
silence that keeps the microphone's timeline whole where packets were lost (PyAV frames from
aiortc's tracks, so this lives with the WebRTC transport, not in the pure server/runtime)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError
from av.frame import Frame
from av.packet import Packet

# a longer skip is not lost packets but a sender that stopped (muted, on hold): not filled
MAX_FILLED_MS = 1000


async def frames(track: MediaStreamTrack) -> AsyncIterator[Frame | Packet[Any]]:
    """Every frame a remote track delivers, until the track ends."""
    while True:
        try:
            yield await track.recv()
        except MediaStreamError:
            return


class Gaps:
    """Where the microphone's frames skip time (a packet lost, or dropped for coming late):
    silence in its place, so that the audio heard keeps the sender's timeline, on which the
    turn detector counts quiet and the echo path finds the avatar's voice."""

    def __init__(self) -> None:
        self._next: int | None = None  # the pts the next frame should have
        self.filled_ms = 0.0  # silence put in so far

    def before(self, frame: av.AudioFrame) -> av.AudioFrame | None:
        """Silence for the time between the previous frame and ``frame`` (the frames' format,
        rate and layout), or None: no skip, a frame without a time, or a skip over
        ``MAX_FILLED_MS``."""
        if frame.pts is None or frame.time_base is None:
            self._next = None
            return None
        expected, self._next = (
            self._next,
            frame.pts + round(frame.samples / (frame.sample_rate * frame.time_base)),
        )
        if expected is None or frame.pts <= expected:
            return None
        samples = round((frame.pts - expected) * frame.time_base * frame.sample_rate)
        if samples <= 0 or samples * 1000 > MAX_FILLED_MS * frame.sample_rate:
            return None
        self.filled_ms += samples * 1000 / frame.sample_rate
        return silence_like(frame, samples, expected)


def silence_like(frame: av.AudioFrame, samples: int, pts: int) -> av.AudioFrame:
    """``samples`` of silence in ``frame``'s format, layout, rate and time base, at ``pts``."""
    channels = len(frame.layout.channels)
    dtype = frame.to_ndarray().dtype
    shape = (channels, samples) if frame.format.is_planar else (1, samples * channels)
    silent = av.AudioFrame.from_ndarray(
        np.zeros(shape, dtype), format=frame.format.name, layout=frame.layout.name
    )
    silent.sample_rate = frame.sample_rate
    silent.pts = pts
    silent.time_base = frame.time_base
    return silent
