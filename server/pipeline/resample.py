"""Mono int16 audio from one sample rate to another, with PyAV (outside the pure
server/runtime, which knows no codec library)."""

from __future__ import annotations

import av
import numpy as np
import numpy.typing as npt


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
