"""Voice activity models on 16 kHz mono int16 audio: webrtcvad (cheap gate) and Silero (confirm).

The Silero model is the ONNX file that faster-whisper ships (no download at run time).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

RATE_HZ = 16_000
Pcm16k = npt.NDArray[np.int16]


class SpeechGate(Protocol):
    """A cheap per-frame voiced/unvoiced decision (10, 20 or 30 ms frames)."""

    def is_speech(self, frame: Pcm16k) -> bool: ...


class SpeechProbability(Protocol):
    """A streaming speech probability; ``reset()`` forgets the audio seen so far."""

    window: int  # samples per call

    def probability(self, window: Pcm16k) -> float: ...

    def reset(self) -> None: ...


class WebRtcGate:
    """webrtcvad at 16 kHz; aggressiveness 0 (lenient) to 3 (strict)."""

    def __init__(self, aggressiveness: int) -> None:
        import webrtcvad

        self._vad = webrtcvad.Vad(aggressiveness)

    def is_speech(self, frame: Pcm16k) -> bool:
        return bool(self._vad.is_speech(frame.tobytes(), RATE_HZ))


def silero_model_path() -> Path:
    """The Silero VAD ONNX file inside the installed faster-whisper package."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("faster-whisper is not installed: it ships the Silero VAD model")
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / "silero_vad_v6.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"Silero VAD model missing: {path}")
    return path


class SileroModel:
    """Silero VAD v6 (ONNX, CPU, one thread); one loaded model serves every stream."""

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 4
        model = path or silero_model_path()
        log.info("loading Silero VAD from %s", model)
        self.session = onnxruntime.InferenceSession(
            str(model), providers=["CPUExecutionProvider"], sess_options=opts
        )

    def stream(self) -> SileroVad:
        """A new stream (its own recurrent state) on this model."""
        return SileroVad(self)


class SileroVad:
    """One audio stream through Silero: 512-sample windows (32 ms at 16 kHz) with state."""

    window = 512
    _context = 64

    def __init__(self, model: SileroModel | None = None) -> None:
        self._session = (model or SileroModel()).session
        self.reset()

    def reset(self) -> None:
        self._h = np.zeros((1, 1, 128), np.float32)
        self._c = np.zeros((1, 1, 128), np.float32)
        self._ctx = np.zeros((1, self._context), np.float32)

    def probability(self, window: Pcm16k) -> float:
        """Speech probability (0-1) of the next 512 samples."""
        if window.shape != (self.window,):
            raise ValueError(f"Silero takes {self.window} samples, got {window.shape}")
        audio = (window.astype(np.float32) / 32768.0)[None, :]
        batch = np.concatenate([self._ctx, audio], axis=1)
        out, self._h, self._c = self._session.run(
            None, {"input": batch, "h": self._h, "c": self._c}
        )
        self._ctx = audio[:, -self._context :]
        return float(np.asarray(out).reshape(-1)[-1])
