"""Gestures: momentary face cues the avatar shows on purpose (a smile, a look at the user).

An I/O-free timeline on an injected clock (ms). A cue starts when it is asked for and holds for
its time; then the face is the turn's again. Expressions and looks are two channels: a smile and
a look at the user may be in force together; within a channel the newest cue wins (a new smile
replaces a surprise at once, even a shorter one). The face (``server/avatar/video.py``) asks for
the cue in force at every frame: the expression sets the brows, eyes and resting mouth (the
lip-sync still moves the mouth while the avatar speaks), the look sets the gaze and turns the
head to face that point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from server.avatar.seam import Expression
from server.clock import Clock

AT_USER = (0.0, 0.0)  # the gaze straight at the camera: at the user


class Cue(NamedTuple):
    """What the gestures override at one instant; None: the turn decides."""

    expression: Expression | None
    gaze: tuple[float, float] | None  # (x, y) as FaceState's gaze_x, gaze_y


NO_CUE = Cue(None, None)


@dataclass(frozen=True)
class _Span:
    start_ms: float
    end_ms: float

    def holds(self, now_ms: float) -> bool:
        return self.start_ms <= now_ms < self.end_ms


class Gestures:
    """The face cues of one conversation, on ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._expression: tuple[Expression, _Span] | None = None
        self._gaze: tuple[tuple[float, float], _Span] | None = None
        self.shown = 0  # cues asked for, both kinds

    def show(self, expression: Expression, for_ms: float) -> None:
        """Show ``expression`` from now for ``for_ms`` ms (it replaces any shown now)."""
        self._expression = (expression, self._span(for_ms))
        self.shown += 1

    def look_at_user(self, for_ms: float) -> None:
        """Look straight at the camera, the head turned to the user, for ``for_ms`` ms."""
        self._gaze = (AT_USER, self._span(for_ms))
        self.shown += 1

    def at(self, now_ms: float) -> Cue:
        """The cue in force at ``now_ms`` (a time on the clock): ``(expression, gaze)``."""
        expression = self._expression
        gaze = self._gaze
        return Cue(
            expression[0] if expression is not None and expression[1].holds(now_ms) else None,
            gaze[0] if gaze is not None and gaze[1].holds(now_ms) else None,
        )

    def now(self) -> Cue:
        """The cue in force now."""
        return self.at(self._clock.now_ms())

    def clear(self) -> None:
        """End every cue now (an interruption: the face listens)."""
        self._expression = self._gaze = None

    def _span(self, for_ms: float) -> _Span:
        if not math.isfinite(for_ms) or for_ms <= 0:
            raise ValueError(f"a gesture lasts a positive, finite time, not {for_ms} ms")
        start = self._clock.now_ms()
        return _Span(start, start + for_ms)
