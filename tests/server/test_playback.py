from __future__ import annotations

import numpy as np
import pytest

from server.runtime.media import FRAME_SAMPLES, ms_to_samples
from server.runtime.playback import PlaybackBuffer
from tests.conftest import tone


def make(budget_ms: int = 1000, fade_ms: float = 5.0) -> PlaybackBuffer[str]:
    return PlaybackBuffer(ms_to_samples(budget_ms), ms_to_samples(fade_ms))


def test_accepts_only_within_budget_and_reports_slack() -> None:
    buf = make(1000)
    assert buf.push_audio(1, 0, tone(600)) == ms_to_samples(600)
    # only 400 ms more fit: a prefix is taken, the caller keeps the rest
    assert buf.push_audio(1, 0, tone(700)) == ms_to_samples(400)
    assert buf.space == 0
    assert buf.push_audio(2, 0, tone(100)) == 0
    assert buf.slack_ms == pytest.approx(1000)
    assert buf.generation_cursor - buf.playback_cursor == ms_to_samples(1000)
    buf.pull(FRAME_SAMPLES)
    assert buf.slack_ms == pytest.approx(980)
    assert buf.space == FRAME_SAMPLES


def test_pull_reports_spans_in_chunk_offsets_and_pads_with_silence() -> None:
    buf = make()
    buf.push_audio(7, 0, tone(30))
    first = buf.pull(FRAME_SAMPLES)
    assert first.spans[0].chunk_id == 7 and first.spans[0].start == 0
    second = buf.pull(FRAME_SAMPLES)
    assert second.spans[0].start == FRAME_SAMPLES
    assert second.spans[0].samples == ms_to_samples(10)
    assert not second.pcm[ms_to_samples(10) :].any()  # silence after the end
    assert second.cursor == 2 * FRAME_SAMPLES
    silent = buf.pull(FRAME_SAMPLES)
    assert silent.spans == () and not silent.pcm.any()
    assert buf.playing_chunk is None


def test_underrun_counts_gaps_only_while_a_response_streams() -> None:
    buf = make()
    buf.pull(FRAME_SAMPLES)  # idle before any response: not an underrun
    buf.begin_response(0)
    buf.pull(FRAME_SAMPLES)  # nothing played yet: latency, not an underrun
    assert buf.underruns == 0
    buf.push_audio(1, 0, tone(20))
    assert not buf.pull(FRAME_SAMPLES).underrun
    gap = [buf.pull(FRAME_SAMPLES).underrun for _ in range(3)]
    assert gap == [True, True, True]
    assert buf.underruns == 1  # one gap, three short frames
    assert buf.underrun_samples == 3 * FRAME_SAMPLES
    buf.push_audio(2, 0, tone(20))
    buf.pull(FRAME_SAMPLES)
    buf.end_response(0)
    assert not buf.pull(FRAME_SAMPLES).underrun  # the end of the reply is no underrun
    assert buf.underruns == 1


def test_flush_drops_queued_audio_refuses_old_epoch_and_fades() -> None:
    buf = make(2000, fade_ms=5.0)
    buf.push_audio(1, 0, tone(1000, amplitude=10000))
    buf.pull(FRAME_SAMPLES)
    dropped = buf.flush(1)
    assert dropped == ms_to_samples(980)
    assert buf.buffered == 0 and buf.epoch == 1
    assert buf.push_audio(1, 0, tone(100)) == 0  # an old-epoch straggler
    assert buf.rejected_stale == 1
    faded = buf.pull(FRAME_SAMPLES)
    fade = ms_to_samples(5)
    assert faded.spans == ()  # the fade is not "played" chunk audio
    tail = np.abs(faded.pcm[:fade].astype(np.int32))
    assert tail[-1] < 500 and not faded.pcm[fade:].any()
    # silent within one 20 ms frame of the decision
    assert not buf.pull(FRAME_SAMPLES).pcm.any()
    with pytest.raises(ValueError):
        buf.flush(1)


def test_video_frames_follow_the_audio_position() -> None:
    buf = make(1000)
    buf.push_audio(3, 0, tone(100))
    assert buf.push_video(3, 0, 0, "A")
    assert buf.push_video(3, 0, ms_to_samples(40), "B")
    assert not buf.push_video(3, 0, ms_to_samples(1500), "too far ahead")
    assert buf.video_at() is None  # nothing played yet: idle frame
    buf.pull(FRAME_SAMPLES)
    assert buf.video_at() == "A"
    buf.pull(FRAME_SAMPLES)
    assert buf.video_at() == "B"  # offset 40 ms reached
    buf.flush(1)
    assert buf.video_at() is None
    assert not buf.push_video(3, 0, 0, "stale")
