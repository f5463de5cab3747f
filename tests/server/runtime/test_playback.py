from __future__ import annotations

import numpy as np
import pytest

from server.runtime.media import FRAME_SAMPLES, ms_to_samples
from server.runtime.playback import PlaybackBuffer
from tests.conftest import tone


class Epochs:
    """The session's epoch, as the buffer reads it (``now``)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def make(
    budget_ms: int = 1000, fade_ms: float = 5.0, epochs: Epochs | None = None
) -> PlaybackBuffer[str]:
    return PlaybackBuffer(ms_to_samples(budget_ms), ms_to_samples(fade_ms), epochs or Epochs())


def barge(buf: PlaybackBuffer[str], epochs: Epochs) -> int:
    """The session bumps its epoch and flushes the buffer; the samples dropped."""
    epochs.now += 1
    return buf.flush()


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
    epochs = Epochs()
    buf = make(2000, fade_ms=5.0, epochs=epochs)
    buf.push_audio(1, 0, tone(1000, amplitude=10000))
    buf.pull(FRAME_SAMPLES)
    dropped = barge(buf, epochs)
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
        buf.flush()  # no new epoch


def test_video_frames_follow_the_audio_position() -> None:
    epochs = Epochs()
    buf = make(1000, epochs=epochs)
    buf.push_audio(3, 0, tone(100))
    assert buf.push_video(3, 0, 0, "A")
    assert buf.push_video(3, 0, ms_to_samples(40), "B")
    assert not buf.push_video(3, 0, ms_to_samples(1500), "too far ahead")
    assert buf.video_at() is None  # nothing played yet: idle frame
    buf.pull(FRAME_SAMPLES)
    assert buf.video_at() == "A"
    buf.pull(FRAME_SAMPLES)
    assert buf.video_at() == "B"  # offset 40 ms reached
    barge(buf, epochs)
    assert buf.video_at() is None
    assert not buf.push_video(3, 0, 0, "stale")


# --- pause first, decide second: the buffer holds, then plays on from the same sample --------
def ramp_pcm(samples: int) -> np.ndarray:
    """Audio whose every sample differs from its neighbours (1, 2, 3, ...): a skipped or
    repeated sample shows."""
    return (np.arange(samples) % 30_000 + 1).astype(np.int16)


def test_pause_holds_every_sample_and_resume_plays_on_from_the_same_one() -> None:
    buf = make(fade_ms=0.0)
    reply = ramp_pcm(ms_to_samples(200))
    buf.begin_response(0)
    buf.push_audio(1, 0, reply)
    played = [buf.pull(FRAME_SAMPLES).pcm for _ in range(3)]
    assert buf.pause() and not buf.pause()  # a second pause changes nothing
    held = [buf.pull(FRAME_SAMPLES) for _ in range(5)]
    assert all(not p.pcm.any() and p.spans == () and not p.underrun for p in held)
    assert buf.buffered == len(reply) - 3 * FRAME_SAMPLES  # nothing consumed
    assert buf.underruns == 0
    assert buf.resume() == 5 * FRAME_SAMPLES  # the pause's length
    while buf.buffered:
        played.append(buf.pull(FRAME_SAMPLES).pcm)
    heard = np.concatenate(played)[: len(reply)]
    assert np.array_equal(heard, reply)  # not a sample skipped or repeated


def test_pause_fades_a_copy_and_resume_fades_in_from_the_paused_sample() -> None:
    buf = make(fade_ms=5.0)
    fade = ms_to_samples(5)
    reply = np.full(ms_to_samples(200), 10_000, np.int16)
    buf.push_audio(1, 0, reply)
    buf.pull(FRAME_SAMPLES)
    buf.pause()
    faded = buf.pull(FRAME_SAMPLES)
    assert faded.spans == ()  # the fade is a copy, not counted as played
    assert 0 < faded.pcm[0] <= 10_000 and faded.pcm[fade - 1] < 500 and not faded.pcm[fade:].any()
    assert buf.buffered == len(reply) - FRAME_SAMPLES
    buf.resume()
    resumed = buf.pull(FRAME_SAMPLES)
    assert resumed.spans[0].start == FRAME_SAMPLES  # from the sample where it paused
    assert resumed.pcm[0] < 500 and resumed.pcm[fade] == 10_000  # faded in, then as made


def test_chunks_not_yet_started_move_later_by_the_pause() -> None:
    buf = make(fade_ms=0.0)
    buf.push_audio(1, 0, tone(40))
    buf.push_audio(2, 0, tone(40))
    assert buf.chunk_position(2) == ms_to_samples(40)
    buf.pull(FRAME_SAMPLES)
    buf.pause()
    for _ in range(3):
        buf.pull(FRAME_SAMPLES)
    buf.resume()
    assert buf.chunk_position(2) == ms_to_samples(40) + 3 * FRAME_SAMPLES


def test_a_flush_while_paused_plays_nothing_more() -> None:
    epochs = Epochs()
    buf = make(fade_ms=5.0, epochs=epochs)
    buf.push_audio(1, 0, tone(200))
    buf.pull(FRAME_SAMPLES)
    buf.pause()
    buf.pull(FRAME_SAMPLES)  # the fade out
    assert barge(buf, epochs) == ms_to_samples(180)
    assert not buf.paused
    assert not buf.pull(FRAME_SAMPLES).pcm.any()  # no second fade of the flushed audio
