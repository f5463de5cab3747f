"""Outbound tracks paced by the session media clock (aiortc does not pace: tracks must sleep).

Audio: 20 ms frames of 48 kHz mono s16, pts in samples (time base 1/48000). Video: a fixed
frame rate, pts on the 90 kHz clock. Frame k of either track is due at ``t0 + k * duration`` of
one shared clock, so the picture for time t goes out with the audio for time t. A track never
waits on the buffer: on underrun it sends silence / the idle frame.

An audio track that wakes late (the loop was held) sends the frames it owes back to back, up
to ``MAX_CATCH_UP_MS`` of them: a receiver's jitter buffer absorbs that much (its delay grows
by it for a while). Later than that, it skips ahead on the media clock instead: the frames of
the missed time are not sent (the receiver conceals a gap), and audio goes on from the sample
where it stopped. A second of audio sent in a burst would be played that much later than the
playback cursor says, or sped up, or dropped by the client.

A video track owes nothing: late by a frame or more, it skips to the picture due now. A
receiver shows each picture when it comes, so pictures of a past time sent back to back are
never seen as such, and each costs a drawing and an encoding just when the machine is behind
(in the slow profile, at 10 fps: 0-4 pictures skipped in a run of one session's replies,
3-23 with two sessions; benchmarks/realtime_bench.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

import av
import numpy as np
import numpy.typing as npt
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from server.runtime.media import (
    AUDIO_TIME_BASE,
    FRAME_SAMPLES,
    MEDIA_RATE_HZ,
    VIDEO_TIME_BASE,
    samples_to_ms,
)

log = logging.getLogger(__name__)

PCM = npt.NDArray[np.int16]
MAX_CATCH_UP_MS = 200  # the most a late track sends in a burst; beyond it, it skips ahead


def skipped_ticks(
    lateness_s: float, rate_hz: int, frame_ticks: int, catch_up_ms: float = MAX_CATCH_UP_MS
) -> int:
    """The media time (ticks of ``rate_hz``, whole frames of ``frame_ticks``) that a track
    waking ``lateness_s`` late skips: none up to ``catch_up_ms``, else every whole frame of
    the delay (the frame due now then goes out)."""
    if lateness_s * 1000 <= catch_up_ms:
        return 0
    return int(lateness_s * rate_hz) // frame_ticks * frame_ticks


class MediaClock:
    """The session media clock: time 0 is when the first outbound frame is asked for (s)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._t0: float | None = None

    def start(self) -> float:
        if self._t0 is None:
            self._t0 = self._now()
        return self._t0

    def now(self) -> float:
        """Seconds on the clock (starts it if needed)."""
        return self._now() - self.start()

    def peek_ms(self) -> float | None:
        """Milliseconds on the clock, or None before the outbound tracks started it."""
        return None if self._t0 is None else (self._now() - self._t0) * 1000

    async def wait_until(self, media_s: float) -> float:
        """Sleep until media time ``media_s``; returns how late (s) we woke (0 if early)."""
        delay = media_s - self.now()
        if delay > 0:
            await asyncio.sleep(delay)
        return max(0.0, self.now() - media_s)


class AudioSource(Protocol):
    def __call__(self, n: int) -> PCM: ...


class PacedAudioTrack(MediaStreamTrack):
    """Pulls ``FRAME_SAMPLES`` from ``source`` every 20 ms of media time."""

    kind = "audio"

    def __init__(
        self,
        clock: MediaClock,
        source: AudioSource,
        on_sent: Callable[[int, float, PCM], None] | None = None,
        on_skipped: Callable[[int], None] | None = None,
    ) -> None:
        """``on_sent(pts, lateness_s, pcm)``: a frame went out; ``on_skipped(samples)``: the
        track skipped that much media time (whole frames) without pulling from ``source``."""
        super().__init__()
        self._clock = clock
        self._source = source
        self._on_sent = on_sent
        self._on_skipped = on_skipped
        self._pts = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        lateness = await self._clock.wait_until(self._pts / MEDIA_RATE_HZ)
        skipped = skipped_ticks(lateness, MEDIA_RATE_HZ, FRAME_SAMPLES)
        if skipped:
            self._pts += skipped
            log.info(
                "audio track woke %.0f ms late: %.0f ms of media time skipped, not sent in a burst",
                lateness * 1000,
                samples_to_ms(skipped),
            )
            if self._on_skipped is not None:
                self._on_skipped(skipped)
        pcm = self._source(FRAME_SAMPLES)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = MEDIA_RATE_HZ
        frame.pts = self._pts
        frame.time_base = AUDIO_TIME_BASE
        if self._on_sent is not None:
            self._on_sent(self._pts, lateness, pcm)
        self._pts += FRAME_SAMPLES
        return frame


class FrameSource(Protocol):
    """The picture for media time ``media_ms`` (may render off the event loop)."""

    async def __call__(self, media_ms: float) -> av.VideoFrame: ...


class PacedVideoTrack(MediaStreamTrack):
    """Asks ``source`` for the picture of media time t at ``fps`` frames a second."""

    kind = "video"

    def __init__(
        self,
        clock: MediaClock,
        source: FrameSource,
        fps: int,
        on_skipped: Callable[[int], None] | None = None,
    ) -> None:
        """``on_skipped(frames)``: the track woke that many frames late and drew none of
        them."""
        super().__init__()
        self._clock = clock
        self._source = source
        self._ticks = 90_000 // fps
        self._pts = 0
        self._on_skipped = on_skipped

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        media_s = float(self._pts * VIDEO_TIME_BASE)
        lateness = await self._clock.wait_until(media_s)
        skipped = skipped_ticks(lateness, VIDEO_TIME_BASE.denominator, self._ticks, 0.0)
        if skipped:  # the picture of now, not of the missed time
            self._pts += skipped
            if self._on_skipped is not None:
                self._on_skipped(skipped // self._ticks)
            media_s = float(self._pts * VIDEO_TIME_BASE)
        frame = await self._source(media_s * 1000)
        frame.pts = self._pts
        frame.time_base = VIDEO_TIME_BASE
        self._pts += self._ticks
        return frame
