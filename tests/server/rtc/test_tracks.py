"""The paced outbound tracks when they wake late: audio catches a short delay up in a burst
and skips a long one on the media clock (no burst, nothing pulled for the missed time); video
skips to the picture due now from one frame late."""

from __future__ import annotations

from typing import cast

import av
import numpy as np

from server.avatar.video import AvatarVideo
from server.clock import FakeClock
from server.conversation.playout import Playout
from server.metrics import Metrics
from server.rtc.tracks import MAX_CATCH_UP_MS, MediaClock, PacedAudioTrack, PacedVideoTrack
from server.runtime.media import FRAME_SAMPLES, MEDIA_RATE_HZ
from server.runtime.session import Session

FRAME_S = FRAME_SAMPLES / MEDIA_RATE_HZ


class Clock:
    """The media clock's time source (s), moved by the test: every frame is due or late when
    asked for, so no test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Source:
    """Numbered frames: frame k's samples all hold k, so a test sees which were pulled."""

    def __init__(self) -> None:
        self.pulled = 0

    def __call__(self, n: int) -> np.ndarray:
        self.pulled += 1
        return np.full(n, self.pulled, np.int16)


class Faces:
    """A blank picture for every media time asked (ms, in ``asked``)."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, media_ms: float) -> av.VideoFrame:
        self.asked.append(media_ms)
        return av.VideoFrame(16, 16, "rgb24")


def audio_track(
    now: Clock, source: Source
) -> tuple[PacedAudioTrack, list[tuple[int, float]], list[int]]:
    """The track, the (pts, lateness s) of every frame it sends, and what it skipped."""
    sent: list[tuple[int, float]] = []
    held: list[int] = []
    track = PacedAudioTrack(
        MediaClock(now), source, lambda pts, late, _pcm: sent.append((pts, late)), held.append
    )
    return track, sent, held


async def test_a_short_delay_is_caught_up_frame_by_frame() -> None:
    now, source = Clock(), Source()
    track, sent, held = audio_track(now, source)
    await track.recv()
    now.now = 3 * FRAME_S  # 60 ms held: frames 1-3 are owed, within MAX_CATCH_UP_MS
    frames = [await track.recv() for _ in range(3)]
    assert [f.pts for f in frames] == [FRAME_SAMPLES, 2 * FRAME_SAMPLES, 3 * FRAME_SAMPLES]
    assert source.pulled == 4 and held == []
    assert sent[1][1] > 0.039  # frame 1 went out 40 ms late, and the metric says so


async def test_a_long_stall_skips_ahead_and_the_reply_goes_on_from_its_sample() -> None:
    now, source = Clock(), Source()
    track, sent, held = audio_track(now, source)
    first = await track.recv()
    assert first.pts == 0
    now.now = 1.0  # the loop was held for a second
    frame = await track.recv()
    # the frame due now goes out; the 49 frames of the missed second are not sent at all
    assert frame.pts == 50 * FRAME_SAMPLES
    assert held == [49 * FRAME_SAMPLES]
    # nothing was pulled for the missed time: the second frame sent is the source's second
    assert source.pulled == 2 and int(frame.to_ndarray()[0, 0]) == 2
    assert sent[1][0] == 50 * FRAME_SAMPLES and sent[1][1] > 0.9  # the lateness is reported
    assert MAX_CATCH_UP_MS < 980
    now.now = 1.0 + FRAME_S  # back on time: one frame at a time again
    assert (await track.recv()).pts == 51 * FRAME_SAMPLES and held == [49 * FRAME_SAMPLES]


async def test_a_late_video_track_draws_the_picture_of_now() -> None:
    now = Clock()
    face = Faces()
    skips: list[int] = []  # what the track reports as skipped (the server counts it)
    track = PacedVideoTrack(MediaClock(now), face, fps=25, on_skipped=skips.append)
    await track.recv()
    now.now = 0.04  # on time: the next frame
    await track.recv()
    now.now = 1.05  # a second late: one picture, of the frame due at 1.04 s
    late = await track.recv()
    assert face.asked == [0.0, 40.0, 1040.0]
    assert late.pts == 1040 * 90
    assert skips == [24]


async def test_a_video_track_late_by_a_frame_sends_no_picture_of_the_past() -> None:
    """Where audio would catch 100 ms up frame by frame, video draws only the picture of
    now: each picture of the past costs a drawing and an encoding, and is never seen."""
    now = Clock()
    face = Faces()
    skips: list[int] = []
    track = PacedVideoTrack(MediaClock(now), face, fps=10, on_skipped=skips.append)
    await track.recv()
    now.now = 0.13  # the frame due at 0.1 s, 30 ms late: less than a frame, it goes out
    await track.recv()
    now.now = 0.35  # 150 ms late for the frame of 0.2 s: the one of 0.3 s goes out instead
    frame = await track.recv()
    assert face.asked == [0.0, 100.0, 300.0] and frame.pts == 300 * 90
    assert skips == [1]
    now.now = 0.4  # on time again
    await track.recv()
    assert face.asked[-1] == 400.0 and skips == [1]
    assert MAX_CATCH_UP_MS > 0.15 * 1000  # audio late as much would not skip


async def test_media_time_without_the_cursor_keeps_the_face_on_the_cursor() -> None:
    """Skipped or held media time (no samples pulled) moves the media clock ahead of the
    playback cursor: the face is then asked for the cursor's time. (That the echo
    canceller's far end gets the silence the client heard: tests/server/conversation/
    test_interjection.py.)"""
    avatar = Faces()
    playout = Playout(
        cast(Session, None),  # not touched by the calls below
        cast(AvatarVideo, avatar),
        Metrics(),
        FakeClock(),
    )
    playout.base_ms = 500.0  # a resumed link: the cursor was at 500 ms when it attached
    await playout.face_at(1000.0)
    playout.on_cursor_held(50 * FRAME_SAMPLES)  # a second skipped (or sent as silence)
    await playout.face_at(2000.0)
    assert avatar.asked == [1500.0, 1500.0]  # the cursor did not move during that second
