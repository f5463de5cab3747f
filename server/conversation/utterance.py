"""The user's audio of the current turn (16 kHz mono s16), with the pre-roll before it."""

from __future__ import annotations

from collections import deque
from typing import Literal

import numpy as np
import numpy.typing as npt

PREROLL_FRAMES = 150  # 16 kHz frames kept before a speech start (3 s of 20 ms frames)
MAX_UTTERANCE_S = 120  # longer speech is dropped (the turn ends at user_speaking_timeout_ms)


class Utterance:
    """What the user said this turn: the pre-roll, then every frame until the turn ends."""

    def __init__(self) -> None:
        self._preroll: deque[npt.NDArray[np.int16]] = deque(maxlen=PREROLL_FRAMES)
        self._frames: list[npt.NDArray[np.int16]] = []
        self.samples = 0  # 16 kHz samples in the utterance
        self._into: Literal["preroll", "frames"] | None = None  # where the last frame went
        self.preroll_ms = 500  # of audio before the speech start given to the transcript

    def keep(self, pcm: npt.NDArray[np.int16], speaking: bool) -> None:
        """One frame: into the utterance while the user has the floor, else the pre-roll."""
        self._into = None  # (an utterance past MAX_UTTERANCE_S drops it)
        if not speaking:
            self._preroll.append(pcm)
            self._into = "preroll"
        elif self.samples < MAX_UTTERANCE_S * 16_000:
            self._frames.append(pcm)
            self.samples += len(pcm)
            self._into = "frames"

    def repair(self, pcm: npt.NDArray[np.int16]) -> None:
        """The last ``len(pcm)`` samples kept are heard as ``pcm`` instead (the echo path's
        rewind: a soft onset the canceller damped); as many as are still kept, where the turn
        began or ended since."""
        if self._into is None:
            return
        kept = self._frames if self._into == "frames" else self._preroll
        end = len(pcm)
        for i in range(len(kept) - 1, -1, -1):
            if end <= 0:
                break
            old = kept[i]
            start = max(0, end - len(old))
            new = old.copy()
            new[len(old) - (end - start) :] = pcm[start:end]
            kept[i] = new
            end = start

    def begin(self, back_ms: float = 0.0) -> None:
        """Speech started: the utterance opens with the pre-roll (its last ``preroll_ms``, plus
        ``back_ms`` of speech heard before the turn began: a judged interjection)."""
        self._frames = self._last(self.preroll_ms + back_ms)
        self.samples = sum(len(p) for p in self._frames)
        self._preroll.clear()
        self._into = "frames" if self._frames else None

    def recent(self, ms: float) -> npt.NDArray[np.int16]:
        """The last ``ms`` of audio heard outside the user's turn (the pre-roll's end)."""
        frames = self._last(ms)
        return np.concatenate(frames) if frames else np.zeros(0, np.int16)

    def _last(self, ms: float) -> list[npt.NDArray[np.int16]]:
        wanted = ms * 16
        frames: list[npt.NDArray[np.int16]] = []
        for pcm in reversed(self._preroll):
            if sum(len(p) for p in frames) >= wanted:
                break
            frames.insert(0, pcm)
        return frames

    def audio(self) -> npt.NDArray[np.int16]:
        return np.concatenate(self._frames) if self._frames else np.zeros(0, np.int16)

    def take(self) -> npt.NDArray[np.int16]:
        """The whole utterance; the buffer is empty afterwards."""
        audio = self.audio()
        self.clear()
        return audio

    def clear(self) -> None:
        self._frames, self.samples = [], 0
        if self._into == "frames":
            self._into = None
