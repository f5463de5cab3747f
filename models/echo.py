"""Acoustic echo cancellation: WebRTC's audio processing module (AEC3) on 16 kHz mono int16.

The module comes from the ``livekit`` package (Apache-2.0), whose prebuilt native library
carries libwebrtc's ``AudioProcessing``. AEC3 estimates the echo path (its delay and its
gain, over frequency) online from the far-end audio it is given, subtracts the echo it
predicts and suppresses what is left, keeping the near-end talker (double talk).

Frames are exactly 10 ms (160 samples). The far end (what the speaker will play) goes in
through :meth:`WebRtcEchoCanceller.render`, the microphone through
:meth:`WebRtcEchoCanceller.capture`, in the order they happen. One instance per audio
stream; not thread-safe (one owner calls it).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

RATE_HZ = 16_000
FRAME_SAMPLES = RATE_HZ // 100  # 10 ms, the module's only frame length
Pcm16k = npt.NDArray[np.int16]


class EchoError(RuntimeError):
    """The echo canceller could not be started, or refused a frame."""


class WebRtcEchoCanceller:
    """WebRTC AEC3 with its high-pass filter; no noise suppression or gain control (the
    voice activity models and the recogniser were tuned on unprocessed audio)."""

    def __init__(self) -> None:
        try:
            from livekit import rtc
        except ImportError as exc:
            raise EchoError("the livekit package (WebRTC audio processing) is missing") from exc
        try:
            self._apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)
            self._apm.set_stream_delay_ms(0)  # unknown here: AEC3 estimates the delay itself
        except Exception as exc:  # the native library raises untyped errors
            raise EchoError(f"cannot start WebRTC audio processing: {exc}") from exc
        # one buffer for each direction, handed to the module by address (no copies)
        self._far = bytearray(FRAME_SAMPLES * 2)
        self._near = bytearray(FRAME_SAMPLES * 2)
        self._far_frame: Any = rtc.AudioFrame(self._far, RATE_HZ, 1, FRAME_SAMPLES)
        self._near_frame: Any = rtc.AudioFrame(self._near, RATE_HZ, 1, FRAME_SAMPLES)
        self._far_pcm = np.frombuffer(self._far, np.int16)
        self._near_pcm = np.frombuffer(self._near, np.int16)

    def render(self, frame: Pcm16k) -> None:
        """One 10 ms far-end frame: audio the client is about to play."""
        check(frame)
        self._far_pcm[:] = frame
        try:
            self._apm.process_reverse_stream(self._far_frame)
        except RuntimeError as exc:
            raise EchoError(f"far-end frame refused: {exc}") from exc

    def capture(self, frame: Pcm16k) -> Pcm16k:
        """One 10 ms microphone frame, with the echo of the far end removed (a new array)."""
        check(frame)
        self._near_pcm[:] = frame
        try:
            self._apm.process_stream(self._near_frame)
        except RuntimeError as exc:
            raise EchoError(f"microphone frame refused: {exc}") from exc
        return self._near_pcm.copy()


def check(frame: Pcm16k) -> None:
    if frame.shape != (FRAME_SAMPLES,):
        raise EchoError(
            f"a frame is {FRAME_SAMPLES} samples (10 ms at {RATE_HZ} Hz), not {frame.shape}"
        )
