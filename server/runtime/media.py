"""Media time on the session clock: integer samples at 48 kHz with a ``Fraction`` time base."""

from __future__ import annotations

from fractions import Fraction

import av
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


def resample(pcm: npt.NDArray[np.int16], rate_hz: int, to_hz: int) -> npt.NDArray[np.int16]:
    """Mono int16 audio at ``rate_hz`` resampled to ``to_hz`` with PyAV (flushed)."""
    if rate_hz == to_hz:
        return pcm.astype(np.int16)
    if pcm.size == 0:
        return np.zeros(0, np.int16)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=to_hz)
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1), format="s16", layout="mono"
    )
    frame.sample_rate = rate_hz
    parts = [
        f.to_ndarray().reshape(-1) for f in [*resampler.resample(frame), *resampler.resample(None)]
    ]
    return np.concatenate(parts).astype(np.int16) if parts else np.zeros(0, np.int16)


def pcm_level(pcm: npt.NDArray[np.int16]) -> float:
    """RMS level of int16 samples, 0..1 (a full-scale sine ~0.7; no samples: 0)."""
    if len(pcm) == 0:
        return 0.0
    return float(np.sqrt(np.mean(pcm.astype(np.float32) ** 2)) / 32768.0)
