"""Media time on the session clock: integer samples at 48 kHz with a ``Fraction`` time base."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import numpy.typing as npt

MEDIA_RATE_HZ = 48_000
"""Sample rate of the session media clock and of outbound audio (Hz)."""

AUDIO_TIME_BASE = Fraction(1, MEDIA_RATE_HZ)
"""Time base of audio pts (seconds per sample)."""

VIDEO_TIME_BASE = Fraction(1, 90_000)
"""Time base of video pts (RTP video clock, seconds per tick)."""

FRAME_MS = 20
"""Duration of one outbound audio frame (ms)."""

FRAME_SAMPLES = MEDIA_RATE_HZ * FRAME_MS // 1000
"""Samples in one outbound audio frame (960 at 48 kHz)."""


def ms_to_samples(ms: float) -> int:
    """Convert milliseconds to whole samples at 48 kHz (rounded to nearest)."""
    return round(ms * MEDIA_RATE_HZ / 1000)


def samples_to_ms(samples: int) -> float:
    """Convert samples at 48 kHz to milliseconds."""
    return samples * 1000 / MEDIA_RATE_HZ


def pcm_level(pcm: npt.NDArray[np.int16]) -> float:
    """RMS level of int16 samples, 0..1 (a full-scale sine ~0.7; no samples: 0)."""
    if len(pcm) == 0:
        return 0.0
    return float(np.sqrt(np.mean(pcm.astype(np.float32) ** 2)) / 32768.0)
