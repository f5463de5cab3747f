"""What the avatar's face does at media time t: blinks, idle head motion, nods, gaze, expression.

Deterministic: the same seed and the same inputs at the same media times give the same faces.
Time is the session media clock in ms (never the wall clock), so tests drive it directly.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from server.avatar.seam import Expression, FaceState, Viseme

BLINK_MS = 160.0  # a blink: lids close and reopen
BLINK_GAP_MS = (2200.0, 5600.0)  # time between blinks, uniform
NOD_MS = 700.0  # one nod, down and back
NOD_DEGREES = 4.0
NOD_MIN_GAP_MS = 1800.0
PHRASE_MIN_MS = 900.0  # the user spoke at least this long ...
PAUSE_MS = 220.0  # ... then paused this long: a listener nods
VOICE_LEVEL = 0.02  # user audio RMS (0..1) above which the user is voicing
GAZE_TAU_MS = 250.0  # gaze follows its target with this time constant
FACING_TAU_MS = 200.0  # the head turns to face a gazed point with this time constant
FACING_KEEP = 0.1  # the share of its idle sway a head facing a point keeps
FACING_DEGREES = (4.0, 3.0)  # head yaw, pitch toward a point at gaze 1


@dataclass(frozen=True)
class Attention:
    """Where the user is, from the vision stage: face centre in -1..1 (x right, y down)."""

    x: float
    y: float


class FaceAnimator:
    """Turns session state into :class:`FaceState` values, one per video frame."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        phases = random.Random(seed ^ 0x5EED)
        self._phase = [phases.uniform(0, 2 * math.pi) for _ in range(6)]
        self._next_blink = self._rng.uniform(*BLINK_GAP_MS)
        self._blink_start = -1e9
        self._nod_start = -1e9
        self._voiced_since: float | None = None
        self._last_voiced = -1e9
        self._gaze = (0.0, 0.0)
        self._facing = 0.0  # 0 = free idle motion .. 1 = facing the gazed point
        self._last_ms: float | None = None
        self.nods = 0

    def hear_user(self, media_ms: float, level: float) -> None:
        """The user's audio level (RMS, 0..1) at ``media_ms``: drives listening nods."""
        if level >= VOICE_LEVEL:
            if self._voiced_since is None:
                self._voiced_since = media_ms
            self._last_voiced = media_ms
            return
        spoke = self._voiced_since is not None and (
            self._last_voiced - self._voiced_since >= PHRASE_MIN_MS
        )
        if spoke and media_ms - self._last_voiced >= PAUSE_MS:
            if media_ms - self._nod_start >= NOD_MIN_GAP_MS:
                self._nod_start = media_ms
                self.nods += 1
            self._voiced_since = None
        elif media_ms - self._last_voiced >= PAUSE_MS:
            self._voiced_since = None

    def face(
        self,
        media_ms: float,
        appearance: str,
        expression: Expression,
        viseme: Viseme = Viseme.SIL,
        weight: float = 0.0,
        attention: Attention | None = None,
        shown: Expression | None = None,
        look: tuple[float, float] | None = None,
    ) -> FaceState:
        """The face for ``media_ms`` (call with non-decreasing times).

        ``expression`` is the turn's (a speaking face moves its mouth); a gesture's cue
        overrides what the face conveys: ``shown`` sets the brows, eyes and resting mouth (the
        visemes still move the mouth while speaking), ``look`` the gaze (x, y), with the head
        turned to face that point (0, 0: the camera, the user)."""
        first, last = self._last_ms is None, self._last_ms or 0.0
        self._last_ms = media_ms
        speaking = expression is Expression.SPEAKING
        mood = shown or expression
        blink = self._blink(media_ms)
        yaw, pitch, roll = self._idle_motion(media_ms, mood, speaking)
        dt = max(0.0, media_ms - last)
        facing = 0.0 if look is None else 1.0
        keep = 0.0 if first else math.exp(-dt / FACING_TAU_MS)
        self._facing = facing + (self._facing - facing) * keep
        if self._facing < 1e-3:
            self._facing = 0.0  # turned back: free again
        if self._facing > 0.0:
            to_yaw, to_pitch = look or (0.0, 0.0)
            free = 1.0 - self._facing * (1.0 - FACING_KEEP)
            yaw = free * yaw + self._facing * to_yaw * FACING_DEGREES[0]
            pitch = free * pitch + self._facing * to_pitch * FACING_DEGREES[1]
        pitch += self._nod(media_ms)
        gx, gy = look if look is not None else self._gaze_target(media_ms, mood, attention)
        keep = 0.0 if first else math.exp(-dt / GAZE_TAU_MS)
        self._gaze = (gx + (self._gaze[0] - gx) * keep, gy + (self._gaze[1] - gy) * keep)
        if not speaking:
            viseme, weight = Viseme.SIL, 0.0
        return FaceState(
            appearance=appearance,
            viseme=viseme,
            viseme_weight=round(weight, 3),
            expression=mood,
            blink=round(blink, 3),
            head_yaw=round(yaw, 2),
            head_pitch=round(pitch, 2),
            head_roll=round(roll, 2),
            gaze_x=round(self._gaze[0], 3),
            gaze_y=round(self._gaze[1], 3),
        )

    def _blink(self, t: float) -> float:
        if t >= self._next_blink:
            self._blink_start = self._next_blink
            self._next_blink = t + self._rng.uniform(*BLINK_GAP_MS)
        into = t - self._blink_start
        if not 0 <= into < BLINK_MS:
            return 0.0
        return math.sin(math.pi * into / BLINK_MS)  # close, then open

    def _idle_motion(
        self, t: float, expression: Expression, speaking: bool
    ) -> tuple[float, float, float]:
        """Slow sums of sines: never still, never repeating quickly (degrees)."""
        s = t / 1000.0
        p = self._phase
        lively = 1.6 if speaking else 1.0
        yaw = lively * (1.6 * math.sin(0.31 * s + p[0]) + 0.7 * math.sin(0.83 * s + p[1]))
        pitch = lively * (0.9 * math.sin(0.47 * s + p[2]) + 0.4 * math.sin(1.37 * s + p[3]))
        roll = 0.8 * math.sin(0.23 * s + p[4]) + 0.3 * math.sin(0.71 * s + p[5])
        if expression is Expression.LISTENING:
            roll += 2.5  # a slight attentive tilt
        elif expression is Expression.THINKING:
            roll -= 1.5
            pitch -= 1.5
        elif expression is Expression.SMILING:
            roll += 1.5  # a friendly tilt
        elif expression is Expression.SURPRISED:
            pitch -= 1.5  # the head draws back
        return yaw, pitch, roll

    def _nod(self, t: float) -> float:
        into = t - self._nod_start
        if not 0 <= into < NOD_MS:
            return 0.0
        return NOD_DEGREES * math.sin(math.pi * into / NOD_MS) ** 2

    def _gaze_target(
        self, t: float, expression: Expression, attention: Attention | None
    ) -> tuple[float, float]:
        if expression is Expression.THINKING:
            return 0.55, -0.45  # looks up and aside while it thinks
        if attention is not None:
            # the camera mirrors: a user on the viewer's left of their picture is on our right
            return max(-1.0, min(1.0, -attention.x)), max(-1.0, min(1.0, attention.y * 0.6))
        s = t / 1000.0
        wander = 0.25 if expression is Expression.IDLE else 0.08
        return wander * math.sin(0.19 * s + self._phase[0]), 0.5 * wander * math.sin(0.29 * s)
