"""Spoken test audio from espeak-ng (installed by scripts/setup.sh), at 48 kHz mono int16, and
measures of what a peer heard."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt

from client.cli import load_wav


@functools.cache
def speak(text: str, rate: int | None = None) -> npt.NDArray[np.int16]:
    """``text`` spoken by espeak-ng (``rate``: words a minute; its default 175), resampled
    to 48 kHz mono."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is required for spoken test audio (scripts/setup.sh)")
    speed = [] if rate is None else ["-s", str(rate)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(
            ["espeak-ng", *speed, "-w", str(path), text], check=True, capture_output=True
        )
        return load_wav(path)


def voiced_span_ms(pcm: npt.NDArray[np.int16], threshold: int = 500) -> tuple[float, float]:
    """First and last sample louder than ``threshold``, in ms at 48 kHz."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > threshold)
    return loud[0] / 48.0, loud[-1] / 48.0


def silence(ms: float) -> npt.NDArray[np.int16]:
    return np.zeros(int(ms * 48), np.int16)


def rms(pcm: npt.NDArray[np.int16]) -> float:
    """Root mean square of the samples (0 for none)."""
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0


def loud_frames(pcm: npt.NDArray[np.int16], threshold: float, frame: int) -> list[bool]:
    """For each whole ``frame``-sample frame of ``pcm``: whether its RMS is above ``threshold``."""
    return [rms(pcm[i : i + frame]) > threshold for i in range(0, len(pcm) - frame + 1, frame)]


def loud_seconds(pcm: npt.NDArray[np.int16], threshold: float = 1000.0, frame: int = 960) -> float:
    """Seconds of ``pcm`` (48 kHz) in whole ``frame``-sample frames (20 ms) with an RMS above
    ``threshold``: clearly audible audio, such as a reply tone."""
    return sum(loud_frames(pcm, threshold, frame)) * frame / 48_000
