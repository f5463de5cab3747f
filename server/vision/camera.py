"""The vision stage of one session: the client's camera, sampled into the vision model.

A few frames a second (``vision.sample_fps``) are shrunk and analysed off the event loop; the
debounced presence becomes an event and a persona note, and the face position steers the gaze.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable

import av
import numpy as np

from server.avatar.face import Attention
from server.clock import Clock
from server.config import VisionConfig
from server.vision.sampling import FrameSampler, PresenceTracker, VisionModel, small_size


class CameraStage:
    """Consumes a camera track; calls ``on_change`` when the user's presence changes."""

    def __init__(
        self,
        session_id: str,
        config: VisionConfig,
        model: VisionModel | None,
        clock: Clock,
        on_change: Callable[[PresenceTracker], None],
    ) -> None:
        self._config = config
        self._model = model if config.enabled else None
        self._clock = clock
        self._on_change = on_change
        self._sampler = FrameSampler(config.sample_fps)
        self.presence = PresenceTracker(
            session_id, config.present_after_ms, config.away_after_ms, config.smoothing_ms
        )

    async def consume(self, frames: AsyncIterable[object]) -> None:
        """Read every frame of the camera track until it ends (aiortc queues them unbounded;
        server/rtc/inbound.py reads them); analyse the sampled ones."""
        async for frame in frames:
            if not isinstance(frame, av.VideoFrame):
                continue
            at_ms = self._clock.now_ms()
            if self._model is None or not self._sampler.take(at_ms):
                continue
            width, height = small_size(frame.width, frame.height, self._config.max_side)
            rgb = np.asarray(frame.to_ndarray(format="rgb24", width=width, height=height), np.uint8)
            face = await asyncio.to_thread(self._model.observe, rgb)
            if self.presence.update(at_ms, face):
                self._on_change(self.presence)
        if self.presence.camera_lost(self._clock.now_ms()):
            self._on_change(self.presence)

    def attention(self) -> Attention | None:
        """Where the user's face is, while they are present."""
        seen = self.presence.observation
        return Attention(seen.x, seen.y) if seen.present else None
