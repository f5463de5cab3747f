"""The pipeline's stages: a leaf of the vocabulary that the runtime and the scheduler share."""

from __future__ import annotations

from enum import IntEnum


class Stage(IntEnum):
    """Pipeline stages, in data-flow order."""

    ASR = 1
    LLM = 2
    TTS = 3
    AVATAR = 4
    PLAYBACK = 5
