"""A turn detector for conversations that hear nothing in a test (a real TurnDetector whose
gate and confirming model never hear voice)."""

from __future__ import annotations

from typing import Any

from server.config import VadConfig
from server.pipeline.turn_detector import TurnDetector


class _Deaf:
    window = 512

    def is_speech(self, frame: Any) -> bool:
        return False

    def probability(self, window: Any) -> float:
        return 0.0

    def reset(self) -> None:
        pass


def deaf_detector(vad: VadConfig | None = None) -> TurnDetector:
    """A detector that never hears voice (no end-of-turn model)."""
    deaf = _Deaf()
    return TurnDetector(deaf, deaf, vad or VadConfig())
