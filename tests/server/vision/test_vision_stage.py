"""The vision stage's pure parts: presence debouncing, gaze smoothing, frame sampling, shrinking."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import pytest

from server.vision.sampling import (
    FaceObservation,
    FrameSampler,
    Presence,
    PresenceTracker,
    presence_note,
    small_size,
)


@dataclass(frozen=True)
class Face:
    """A face as a vision model reports it (frame units)."""

    x: float
    y: float
    size: float


CENTRE = Face(0.0, 0.0, 0.3)


def feed(
    tracker: PresenceTracker, start_ms: float, end_ms: float, step_ms: float, face: Face | None
) -> list[tuple[float, Presence]]:
    """Samples every ``step_ms`` in [start, end); the (time, new state) of each change."""
    changes = []
    n = round((end_ms - start_ms) / step_ms)
    for i in range(n):
        at = start_ms + i * step_ms
        if tracker.update(at, face):
            changes.append((at, tracker.presence))
    return changes


def test_starts_unknown_and_becomes_present_after_300_ms_of_face() -> None:
    tracker = PresenceTracker("s")
    assert tracker.presence is Presence.UNKNOWN
    assert feed(tracker, 0, 1000, 100, CENTRE) == [(300, Presence.PRESENT)]
    assert tracker.observation.present


def test_a_single_detection_is_not_presence() -> None:
    tracker = PresenceTracker("s")
    assert not tracker.update(0, CENTRE)
    assert feed(tracker, 100, 1000, 100, None) == []
    assert tracker.presence is Presence.UNKNOWN


def test_a_missed_sample_restarts_the_way_in() -> None:
    tracker = PresenceTracker("s")
    feed(tracker, 0, 300, 100, CENTRE)  # 0..200 ms: 200 ms of face
    assert not tracker.update(300, None)
    assert feed(tracker, 400, 700, 100, CENTRE) == []  # 400..600: 200 ms again
    assert tracker.update(700, CENTRE)
    assert tracker.presence is Presence.PRESENT


def test_away_only_after_3_s_without_a_face() -> None:
    tracker = PresenceTracker("s")
    feed(tracker, 0, 1000, 100, CENTRE)  # last face at 900
    assert feed(tracker, 1000, 5000, 100, None) == [(3900, Presence.AWAY)]
    assert not tracker.observation.present
    assert tracker.event().present is False


def test_unknown_becomes_away_3_s_after_the_first_sample() -> None:
    tracker = PresenceTracker("s")
    assert feed(tracker, 1000, 5000, 500, None) == [(4000, Presence.AWAY)]


def test_single_missed_detections_do_not_flap() -> None:
    tracker = PresenceTracker("s")
    changes = []
    for i in range(200):  # 2 fps for 100 s; every third sample misses the face
        at = i * 500.0
        if tracker.update(at, None if i % 3 == 2 else CENTRE):
            changes.append((at, tracker.presence))
    assert changes == [(500, Presence.PRESENT)]


def test_a_stray_detection_while_away_does_not_bring_the_user_back() -> None:
    tracker = PresenceTracker("s")
    feed(tracker, 0, 4000, 500, None)
    assert tracker.presence is Presence.AWAY
    changes = []
    for i in range(40):  # one false face in every four samples
        at = 4000 + i * 500.0
        if tracker.update(at, CENTRE if i % 4 == 0 else None):
            changes.append(at)
    assert changes == []
    assert feed(tracker, 30_000, 31_000, 500, CENTRE) == [(30_500, Presence.PRESENT)]


def test_presence_returns_after_away() -> None:
    tracker = PresenceTracker("s", present_after_ms=0, away_after_ms=1000)
    assert tracker.update(0, CENTRE)  # 0 ms needed: the first face is enough
    assert feed(tracker, 100, 1200, 100, None) == [(1000, Presence.AWAY)]
    assert feed(tracker, 1200, 1300, 100, Face(0.5, 0.1, 0.2)) == [(1200, Presence.PRESENT)]
    # a face coming back is taken as it is, not smoothed from where the old one was
    assert tracker.observation == FaceObservation(True, 0.5, 0.1, 0.2, 1200)


def test_smoothing_follows_with_the_time_constant() -> None:
    tracker = PresenceTracker("s", smoothing_ms=200)
    feed(tracker, 0, 500, 100, CENTRE)
    assert tracker.presence is Presence.PRESENT
    tracker.update(500, Face(1.0, -1.0, 0.5))  # the face jumps: 100 ms is half a time constant
    a = 1 - math.exp(-100 / 200)
    obs = tracker.observation
    assert (obs.x, obs.y, obs.size) == pytest.approx((a, -a, 0.3 + a * 0.2))
    feed(tracker, 600, 2600, 100, Face(1.0, -1.0, 0.5))  # 10 time constants later: there
    assert tracker.observation.x == pytest.approx(1.0, abs=1e-3)
    assert tracker.observation.y == pytest.approx(-1.0, abs=1e-3)


def test_smoothing_spans_a_missed_sample() -> None:
    tracker = PresenceTracker("s", smoothing_ms=500)
    feed(tracker, 0, 1000, 500, CENTRE)
    tracker.update(1000, None)
    tracker.update(1500, Face(1.0, 0.0, 0.3))  # 1000 ms since the last face
    assert tracker.observation.x == pytest.approx(1 - math.exp(-1000 / 500))


def test_jitter_is_damped() -> None:
    tracker = PresenceTracker("s", smoothing_ms=1000)
    rng = np.random.default_rng(3)
    xs = []
    for i in range(100):  # 2 fps, the detector's x jitters by +-0.1 around 0.2
        tracker.update(i * 500.0, Face(0.2 + float(rng.uniform(-0.1, 0.1)), 0.0, 0.3))
        xs.append(tracker.observation.x)
    settled = np.array(xs[20:])
    assert abs(float(settled.mean()) - 0.2) < 0.03
    assert float(settled.std()) < 0.04  # raw jitter std is 0.058


def test_old_samples_are_ignored() -> None:
    tracker = PresenceTracker("s")
    feed(tracker, 0, 1000, 100, CENTRE)
    assert not tracker.update(500, None)
    assert tracker.observation.at_ms == 900


def test_camera_lost_makes_presence_unknown(caplog: pytest.LogCaptureFixture) -> None:
    tracker = PresenceTracker("session-1")
    with caplog.at_level(logging.INFO, logger="server.vision.sampling"):
        feed(tracker, 0, 500, 100, CENTRE)
        assert tracker.camera_lost(600)
    assert tracker.presence is Presence.UNKNOWN
    assert not tracker.camera_lost(700)
    assert "present -> unknown (camera lost" in caplog.text
    assert "unknown -> present (face seen" in caplog.text
    # after the camera returns, away needs 3 s from the first new sample
    assert feed(tracker, 10_000, 13_500, 500, None) == [(13_000, Presence.AWAY)]


def test_the_event_and_the_note() -> None:
    tracker = PresenceTracker("s")
    feed(tracker, 0, 400, 100, Face(0.25, -0.5, 0.3))
    event = tracker.event().to_dict()
    assert event == {
        "type": "vision.presence",
        "present": True,
        "state": "present",
        "x": 0.25,
        "y": -0.5,
        "size": 0.3,
        "at_ms": 300,
    }
    assert presence_note(Presence.PRESENT) == "The user is in front of the camera."
    assert presence_note(Presence.AWAY) == "The user has stepped away from the camera."
    assert presence_note(Presence.UNKNOWN) == ""


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"away_after_ms": 0}, "away_after_ms"), ({"present_after_ms": -1}, "present_after_ms")],
)
def test_bad_settings_are_refused(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PresenceTracker("s", **kwargs)


@pytest.mark.parametrize(("camera_fps", "fps"), [(30, 2), (30, 5), (25, 2), (15, 10), (30, 30)])
def test_sampler_holds_the_rate(camera_fps: float, fps: float) -> None:
    sampler = FrameSampler(fps)
    taken = [i for i in range(int(camera_fps * 60)) if sampler.take(i * 1000 / camera_fps)]
    assert len(taken) == pytest.approx(fps * 60, abs=1)


def test_sampler_with_jittery_frame_times() -> None:
    sampler = FrameSampler(2)
    rng = np.random.default_rng(5)
    times = np.cumsum(rng.uniform(20, 47, size=3000))  # about 30 fps with jitter, ~100 s
    taken = [float(t) for t in times if sampler.take(float(t))]
    duration_s = float(times[-1] - times[0]) / 1000
    assert len(taken) == pytest.approx(2 * duration_s, abs=2)
    assert min(np.diff(taken)) >= 500 * 3 / 4 - 47  # never a burst


def test_sampler_after_a_gap_takes_one_frame_not_a_burst() -> None:
    sampler = FrameSampler(2)
    assert sampler.take(0)
    assert not sampler.take(100)
    assert sampler.take(10_000)  # the camera paused for 10 s
    assert not sampler.take(10_033)
    assert not sampler.take(10_300)
    assert sampler.take(10_400)  # a quarter period early counts
    assert not sampler.take(10_500)
    assert sampler.take(10_900)


def test_sampler_refuses_a_zero_rate() -> None:
    with pytest.raises(ValueError, match="fps"):
        FrameSampler(0)


def test_small_size_keeps_the_aspect() -> None:
    assert small_size(640, 480) == (320, 240)
    assert small_size(1280, 720) == (320, 180)
    assert small_size(480, 640, max_side=160) == (120, 160)
    assert small_size(200, 100) == (200, 100)
