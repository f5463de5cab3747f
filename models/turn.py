"""End-of-turn classification on 16 kHz mono audio: Smart Turn v3.2 (ONNX, CPU).

The model is the ONNX file that the ``pipecat-ai`` wheel ships (no download at run time); the
package itself is never imported (its dependencies are not installed). It reads Whisper-style
log-mel features of the last 8 s of the user's speech and returns the probability that the user
has finished their turn.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

RATE_HZ = 16_000
WINDOW_S = 8  # seconds of audio the model reads (the end of the utterance)
WINDOW = WINDOW_S * RATE_HZ  # samples
N_FFT = 400  # 25 ms frames
HOP = 160  # 10 ms between frames
N_MELS = 80
_POWER_FLOOR = 1e-10
_DYNAMIC_RANGE = 8.0  # log10 units kept below the loudest bin
_NORM_EPS = 1e-7


def smart_turn_model_path() -> Path:
    """The Smart Turn v3.2 ONNX file inside the installed pipecat-ai package."""
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pipecat-ai is not installed: it ships the Smart Turn model")
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "audio" / "turn" / "smart_turn" / "data" / "smart-turn-v3.2-cpu.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"Smart Turn model missing from pipecat-ai: {path}")
    return path


def _slaney_mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Hz to mels on the Slaney scale: linear below 1 kHz, logarithmic above."""
    linear = hz * 3.0 / 200.0
    logarithmic = 15.0 + np.log(np.maximum(hz, 1000.0) / 1000.0) * 27.0 / np.log(6.4)
    return np.where(hz < 1000.0, linear, logarithmic)


def _slaney_hz(mel: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Mels on the Slaney scale to Hz (the inverse of ``_slaney_mel``)."""
    linear = mel * 200.0 / 3.0
    logarithmic = 1000.0 * np.exp((np.maximum(mel, 15.0) - 15.0) * np.log(6.4) / 27.0)
    return np.where(mel < 15.0, linear, logarithmic)


@functools.cache
def _mel_filters() -> npt.NDArray[np.float64]:
    """(N_MELS, N_FFT // 2 + 1) triangular filters, 0 Hz to Nyquist, Slaney area-normalised."""
    edges = _slaney_hz(
        np.linspace(_slaney_mel(np.array(0.0)), _slaney_mel(np.array(RATE_HZ / 2)), N_MELS + 2)
    )
    bins = np.linspace(0.0, RATE_HZ / 2, N_FFT // 2 + 1)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - lo) / (mid - lo)
    falling = (hi - bins) / (hi - mid)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    filters: npt.NDArray[np.float64] = triangles * (2.0 / (hi - lo))
    return filters


@functools.cache
def _window() -> npt.NDArray[np.float64]:
    """Periodic Hann window of N_FFT samples."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)


def log_mel(audio: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """Whisper-style log-mel features of float audio at 16 kHz, shape (80, len // 160).

    Like Whisper's feature extractor with ``do_normalize``: the waveform is first scaled to
    zero mean and unit variance (in float32, over every sample given, padding included), then
    a centred (reflect-padded) STFT of 25 ms Hann frames every 10 ms gives a power spectrum,
    projected on 80 Slaney mel filters; log10 of that, floored 8 below its maximum, mapped by
    (x + 4) / 4. For 8 s of audio (128000 samples): (80, 800).
    """
    if audio.ndim != 1 or audio.size <= N_FFT // 2:
        raise ValueError(f"log_mel takes 1-D audio of over {N_FFT // 2} samples: {audio.shape}")
    x = audio.astype(np.float32)
    x = (x - x.mean()) / np.sqrt(x.var() + np.float32(_NORM_EPS))
    padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][: x.size // HOP]
    spectrum = np.fft.rfft(frames * _window(), axis=-1)
    power = spectrum.real**2 + spectrum.imag**2  # (frames, bins)
    mel: npt.NDArray[np.float64] = np.log10(np.maximum(_mel_filters() @ power.T, _POWER_FLOOR))
    mel = np.maximum(mel, mel.max() - _DYNAMIC_RANGE)
    return ((mel + 4.0) / 4.0).astype(np.float32)


class SmartTurn:
    """Smart Turn v3.2 on onnxruntime (CPU); one loaded model can serve every stream."""

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 4
        model = path or smart_turn_model_path()
        log.info("loading Smart Turn from %s", model)
        self.session = onnxruntime.InferenceSession(
            str(model), providers=["CPUExecutionProvider"], sess_options=opts
        )

    def probability(self, pcm: npt.NDArray[np.int16]) -> float:
        """Probability (0-1) that the speaker has finished their turn, from 16 kHz mono int16
        audio of any length ending now: its last 8 s are read, shorter audio is zero-padded at
        the start."""
        audio = pcm.reshape(-1)[-WINDOW:].astype(np.float32) / 32768.0
        audio = np.pad(audio, (WINDOW - audio.size, 0))
        features = log_mel(audio)[None, :, :]
        out = self.session.run(None, {"input_features": features})
        return float(np.asarray(out[0]).reshape(-1)[0])
