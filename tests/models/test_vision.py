"""The Haar face detector on drawn faces: found where the face is, not found where none is.

The test image is a frontal face drawn with Pillow in tests/support/faces.py (skin oval, hair,
brows, eyes with dark pupils, shaded nose, mouth, softened edges): no installed package ships a
photo of a face.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from models.vision import DetectedFace, HaarFaceDetector
from server.vision.sampling import FrameSampler, Presence, PresenceTracker, VisionModel
from tests.support.faces import draw_face


@pytest.fixture(scope="module")
def detector() -> HaarFaceDetector:
    return HaarFaceDetector()


def test_the_detector_is_a_vision_model(detector: HaarFaceDetector) -> None:
    model: VisionModel = detector  # checked by mypy: models/ satisfies the server's seam
    face = model.observe(draw_face())
    assert face is not None


@pytest.mark.parametrize(("cx", "cy"), [(320, 240), (160, 240), (480, 240), (320, 170), (220, 300)])
def test_face_position_follows_the_face(detector: HaarFaceDetector, cx: float, cy: float) -> None:
    face = detector.observe(draw_face(cx=cx, cy=cy))
    assert face is not None
    assert face.x == pytest.approx(cx / 640 * 2 - 1, abs=0.06)
    assert face.y == pytest.approx(cy / 480 * 2 - 1, abs=0.08)


def test_shifted_copies_move_x_in_order(detector: HaarFaceDetector) -> None:
    xs = []
    for cx in (200, 280, 360, 440):
        face = detector.observe(draw_face(cx=cx))
        assert face is not None
        xs.append(face.x)
    assert xs == sorted(xs)
    assert xs[-1] - xs[0] == pytest.approx(240 / 640 * 2, abs=0.08)


def test_mirrored_frame_mirrors_x(detector: HaarFaceDetector) -> None:
    frame = draw_face(cx=200)
    left = detector.observe(frame)
    right = detector.observe(np.ascontiguousarray(frame[:, ::-1]))
    assert left is not None and right is not None
    assert left.x < -0.2
    assert right.x == pytest.approx(-left.x, abs=0.03)


def test_size_grows_with_the_face(detector: HaarFaceDetector) -> None:
    sizes = []
    for face_w in (100, 150, 220):
        face = detector.observe(draw_face(face_w=face_w))
        assert face is not None
        # the detector's box spans brows to chin, a bit wider than the skin oval
        assert 0.8 * face_w / 640 < face.size < 2.0 * face_w / 640
        sizes.append(face.size)
    assert sizes == sorted(sizes)


def test_largest_face_wins(detector: HaarFaceDetector) -> None:
    small = draw_face(width=640, height=480, cx=480, cy=240, face_w=110)
    big = draw_face(width=640, height=480, cx=170, cy=240, face_w=200)
    frame = np.concatenate([big[:, :320], small[:, 320:]], axis=1)
    face = detector.observe(frame)
    assert face is not None
    assert face.x < 0  # the big face, on the viewer's left


def test_large_frame_gives_the_same_position(detector: HaarFaceDetector) -> None:
    face = detector.observe(draw_face(width=1280, height=720, cx=800, cy=360, face_w=260))
    assert face is not None
    assert face.x == pytest.approx(800 / 1280 * 2 - 1, abs=0.06)
    assert face.y == pytest.approx(0.0, abs=0.08)


def test_no_face_in_noise_blank_or_a_featureless_head(detector: HaarFaceDetector) -> None:
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, size=(480, 640, 3), dtype=np.uint8)
    blank = np.full((480, 640, 3), 128, dtype=np.uint8)
    assert detector.observe(noise) is None
    assert detector.observe(blank) is None
    assert detector.observe(draw_face(features=False)) is None


def test_rejects_a_frame_that_is_not_rgb(detector: HaarFaceDetector) -> None:
    with pytest.raises(ValueError, match="RGB"):
        detector.observe(np.zeros((480, 640), dtype=np.uint8))


def test_threads_share_one_detector(detector: HaarFaceDetector) -> None:
    frames = [draw_face(cx=cx) for cx in (200, 320, 440)] * 4
    expected = [detector.observe(f) for f in frames]
    with ThreadPoolExecutor(max_workers=3) as pool:
        got = list(pool.map(detector.observe, frames))
    assert got == expected
    assert all(isinstance(f, DetectedFace) for f in got)


def test_camera_stream_to_presence(detector: HaarFaceDetector) -> None:
    """30 fps frames, sampled at 2 fps: present once seen, away 3 s after the user left."""
    sampler = FrameSampler(fps=2.0)
    tracker = PresenceTracker("s", present_after_ms=300, away_after_ms=3000)
    with_face, empty = draw_face(cx=400), draw_face(features=False)
    changes: list[tuple[float, Presence]] = []
    analysed = 0
    for i in range(6 * 30):  # 6 s: the user sits there for 2 s, then leaves
        at_ms = i * 1000 / 30
        if not sampler.take(at_ms):
            continue
        analysed += 1
        frame = with_face if at_ms < 2000 else empty
        if tracker.update(at_ms, detector.observe(frame)):
            changes.append((at_ms, tracker.presence))
    assert analysed == 13  # 0, 400, 900, ... 5900 ms
    assert [p for _, p in changes] == [Presence.PRESENT, Presence.AWAY]
    # samples at 0, 400, 900, 1400 ... ms (the sampler takes a frame up to 125 ms early)
    assert changes[0][0] == pytest.approx(400, abs=1)  # the second sampled face
    assert changes[1][0] == pytest.approx(1900 + 3000, abs=1)  # 3 s after the last face
    assert tracker.observation.x == pytest.approx(400 / 640 * 2 - 1, abs=0.06)
