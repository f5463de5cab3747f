"""The outbound audio level from numpy: aiortc's own figure, exactly, and what its senders use
once the server is set up."""

from __future__ import annotations

import aiortc.rtp
import av
import numpy as np
import pytest

from server.rtc.audio_level import _original, audio_level_dbov, faster_audio_level


@pytest.mark.parametrize("layout", ["mono", "stereo"])
@pytest.mark.parametrize("samples", [960, 441, 1])
@pytest.mark.parametrize("level", [0.0, 1.0, 30.0, 3000.0, 40000.0])
def test_the_level_is_aiortcs_own(layout: str, samples: int, level: float) -> None:
    channels = 2 if layout == "stereo" else 1
    noise = np.random.default_rng(samples).standard_normal(samples * channels) * level
    pcm = noise.clip(-32768, 32767).astype(np.int16)  # 40000: clipped, full scale and past it
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout=layout)
    frame.sample_rate = 48_000
    assert audio_level_dbov(frame) == _original(frame)


def test_the_senders_use_it_once_set_up() -> None:
    try:
        faster_audio_level()
        faster_audio_level()  # idempotent
        assert aiortc.rtp.compute_audio_level_dbov is audio_level_dbov
    finally:
        aiortc.rtp.compute_audio_level_dbov = _original
