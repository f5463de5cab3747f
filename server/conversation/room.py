"""A noisy room: a sound that keeps pausing the reply and is never voice (a beeping phone,
typing) is the room, not the user. After ``NOISY_LAPSES`` such pauses within
``NOISY_WINDOW_MS`` the gate alone no longer pauses the reply while gate onsets keep coming
(``NOISY_HOLD_MS`` apart at most); the reply then pauses when the confirming model hears
speech, and is judged as before (server/conversation/floor.py)."""

from __future__ import annotations

import logging
from collections import deque

from server.clock import Clock

log = logging.getLogger(__name__)

NOISY_LAPSES = 3  # pauses that proved no voice ...
NOISY_WINDOW_MS = 5000.0  # ... within this long: the room is noisy
NOISY_HOLD_MS = 5000.0  # it stays noisy while gate onsets come at most this far apart


class RoomNoise:
    """Whether one conversation's room is taken for noisy (times in ms on ``clock``)."""

    def __init__(self, clock: Clock, sid: str) -> None:
        self._clock = clock
        self._sid = sid
        self._lapses: deque[float] = deque(maxlen=NOISY_LAPSES)  # when pauses proved no voice
        self._noisy_until = float("-inf")  # the gate alone pauses no reply until then (ms)

    def in_noise(self) -> bool:
        """Whether the room is taken for noisy now."""
        return self._clock.now_ms() < self._noisy_until

    def onset(self) -> bool:
        """A gate onset now: whether the room is noisy (it stays so while onsets go on)."""
        if not self.in_noise():
            return False
        self._noisy_until = self._clock.now_ms() + NOISY_HOLD_MS
        return True

    def lapsed(self) -> None:
        """A pause proved no voice; the last NOISY_LAPSES within NOISY_WINDOW_MS: a noisy room."""
        now = self._clock.now_ms()
        self._lapses.append(now)
        full = len(self._lapses) == NOISY_LAPSES
        if full and now - self._lapses[0] <= NOISY_WINDOW_MS and now >= self._noisy_until:
            self._noisy_until = now + NOISY_HOLD_MS
            self._lapses.clear()
            log.info(
                "session %s: %d sounds over the reply were no voice: only confirmed speech"
                " pauses it while such sounds go on",
                self._sid,
                NOISY_LAPSES,
            )
