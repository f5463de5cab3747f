"""The vision stage's server side: which camera frames to analyse, and what a face means.

Camera frames arrive at the client's rate (often 30 fps); :class:`FrameSampler` picks a few per
second, a :class:`VisionModel` (``models/vision.py``; a multimodal model on GPU machines) finds
the user's face, and :class:`PresenceTracker` turns those per-sample findings into a debounced
presence state (an Enum) and a smoothed face position that steers the avatar's gaze.

Positions are in frame units: ``x`` -1 (viewer's left) .. 1 (viewer's right), ``y`` -1 (top) ..
1 (bottom), ``size`` = face width / frame width. Times are ms on the caller's clock.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from server.runtime.events import SessionEvent

log = logging.getLogger(__name__)

Rgb = npt.NDArray[np.uint8]  # height x width x 3, RGB order


class FaceBox(Protocol):
    """One face found in a frame (frame units, see the module docstring)."""

    @property
    def x(self) -> float: ...

    @property
    def y(self) -> float: ...

    @property
    def size(self) -> float: ...


class VisionModel(Protocol):
    """Finds the user's face in an RGB frame; may be called from a worker thread."""

    def observe(self, rgb: Rgb) -> FaceBox | None:
        """The largest face in ``rgb``, or None when there is no face."""
        ...


class Presence(Enum):
    """Whether the user is in front of the camera."""

    UNKNOWN = "unknown"  # no camera, or not enough samples yet
    PRESENT = "present"
    AWAY = "away"


@dataclass(frozen=True)
class FaceObservation:
    """The tracker's current view: presence and the smoothed face position at ``at_ms``."""

    present: bool
    x: float
    y: float
    size: float
    at_ms: float


@dataclass(frozen=True)
class VisionPresence(SessionEvent):
    """``vision.presence``: the user arrived in front of the camera or left it."""

    type: ClassVar[str] = "vision.presence"
    present: bool
    state: str  # a Presence value
    x: float
    y: float
    size: float
    at_ms: float


_NOTES = {
    Presence.UNKNOWN: "",
    Presence.PRESENT: "The user is in front of the camera.",
    Presence.AWAY: "The user has stepped away from the camera.",
}


def presence_note(presence: Presence) -> str:
    """A sentence for the persona's conditions; empty when nothing is known."""
    return _NOTES[presence]


class PresenceTracker:
    """Debounced presence and a smoothed face position from per-sample detections.

    PRESENT after faces were seen over ``present_after_ms`` with no sample missing one; AWAY after
    ``away_after_ms`` without any face (single missed detections never flip it back). The
    position follows the face with an exponential filter of time constant ``smoothing_ms``.
    :meth:`_to` is the one place the state changes (logged ``old -> new``). Pure: no clock.
    """

    def __init__(
        self,
        session_id: str = "",
        present_after_ms: float = 300.0,
        away_after_ms: float = 3000.0,
        smoothing_ms: float = 250.0,
    ) -> None:
        if present_after_ms < 0 or away_after_ms <= 0 or smoothing_ms < 0:
            raise ValueError(
                "vision: present_after_ms >= 0, away_after_ms > 0 and smoothing_ms >= 0 needed"
            )
        self._session_id = session_id
        self._present_after_ms = present_after_ms
        self._away_after_ms = away_after_ms
        self._smoothing_ms = smoothing_ms
        self._state = Presence.UNKNOWN
        self._since_ms: float | None = None  # first sample since start or camera loss
        self._run_start_ms: float | None = None  # start of the current unbroken run of faces
        self._last_face_ms: float | None = None
        self._last_ms: float | None = None
        self._x = 0.0
        self._y = 0.0
        self._size = 0.0

    @property
    def presence(self) -> Presence:
        return self._state

    @property
    def observation(self) -> FaceObservation:
        """Presence and the smoothed position (the last known one while away)."""
        return FaceObservation(
            present=self._state is Presence.PRESENT,
            x=self._x,
            y=self._y,
            size=self._size,
            at_ms=self._last_ms if self._last_ms is not None else 0.0,
        )

    def event(self) -> VisionPresence:
        """The ``vision.presence`` event for the current state."""
        obs = self.observation
        return VisionPresence(
            present=obs.present,
            state=self._state.value,
            x=round(obs.x, 3),
            y=round(obs.y, 3),
            size=round(obs.size, 3),
            at_ms=obs.at_ms,
        )

    def update(self, at_ms: float, face: FaceBox | None) -> bool:
        """Take one analysed sample; True when the presence state changed.

        Samples older than the last one are ignored (returns False).
        """
        if self._last_ms is not None and at_ms < self._last_ms:
            return False
        if self._since_ms is None:
            self._since_ms = at_ms
        self._last_ms = at_ms
        if face is not None:
            self._smooth(face, at_ms)
            self._last_face_ms = at_ms
            if self._run_start_ms is None:
                self._run_start_ms = at_ms
            if (
                self._state is not Presence.PRESENT
                and at_ms - self._run_start_ms >= self._present_after_ms
            ):
                return self._to(Presence.PRESENT, at_ms, "face seen")
            return False
        self._run_start_ms = None
        last_seen = self._last_face_ms if self._last_face_ms is not None else self._since_ms
        if self._state is not Presence.AWAY and at_ms - last_seen >= self._away_after_ms:
            return self._to(Presence.AWAY, at_ms, "no face")
        return False

    def camera_lost(self, at_ms: float) -> bool:
        """The camera stopped sending frames: presence is unknown again. True when it changed."""
        self._since_ms = None
        self._run_start_ms = None
        self._last_face_ms = None
        if self._state is Presence.UNKNOWN:
            return False
        return self._to(Presence.UNKNOWN, at_ms, "camera lost")

    def _smooth(self, face: FaceBox, at_ms: float) -> None:
        returning = self._run_start_ms is None and self._state is not Presence.PRESENT
        if self._last_face_ms is None or returning or self._smoothing_ms == 0:
            # the first face, or one coming back after an absence: jump to it
            self._x, self._y, self._size = face.x, face.y, face.size
            return
        alpha = 1.0 - math.exp(-(at_ms - self._last_face_ms) / self._smoothing_ms)
        self._x += alpha * (face.x - self._x)
        self._y += alpha * (face.y - self._y)
        self._size += alpha * (face.size - self._size)

    def _to(self, new: Presence, at_ms: float, reason: str) -> bool:
        old = self._state
        if new is old:
            return False
        self._state = new
        log.info(
            "session %s vision: %s -> %s (%s at %.0f ms)",
            self._session_id[:8],
            old.value,
            new.value,
            reason,
            at_ms,
        )
        return True


class FrameSampler:
    """Picks camera frames to analyse at ``fps`` frames per second from their times in ms.

    Keeps a grid of due times so the average rate holds with jittery input; a frame up to a
    quarter period before its due time counts (camera jitter when both rates are equal). After a
    gap it restarts from the next frame instead of taking a burst. Pure.
    """

    def __init__(self, fps: float) -> None:
        if not fps > 0:
            raise ValueError(f"vision: sample rate must be > 0 fps (got {fps})")
        self._period_ms = 1000.0 / fps
        self._due_ms: float | None = None

    def take(self, at_ms: float) -> bool:
        """True when the frame at ``at_ms`` should be analysed."""
        if self._due_ms is not None and at_ms < self._due_ms - self._period_ms / 4:
            return False
        if self._due_ms is None or at_ms - self._due_ms >= self._period_ms:
            self._due_ms = at_ms + self._period_ms  # first frame, or behind by a period: restart
        else:
            self._due_ms += self._period_ms
        return True


def small_size(width: int, height: int, max_side: int = 320) -> tuple[int, int]:
    """(width, height) scaled to fit ``max_side`` px, aspect kept; for decoders that scale.

    E.g. ``frame.to_ndarray(format="rgb24", width=w, height=h)`` with PyAV (swscale: about 0.2 ms
    for 640x480 -> 320x240, against 0.1 ms for the full-size conversion).
    """
    if max_side < 1:
        raise ValueError(f"max_side must be >= 1 (got {max_side})")
    scale = min(1.0, max_side / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))
