"""The procedural avatar renderer: deterministic frames that show visemes, blinks, gaze, moods."""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from models.avatar import VISEME_NAMES, Pose, ProceduralAvatar

Frame = npt.NDArray[np.uint8]
# regions of a 512x512 frame at rest (rows, cols)
MOUTH = (slice(262, 345), slice(196, 316))
LEFT_EYE = (slice(204, 248), slice(186, 236))
EYES = (slice(196, 256), slice(176, 336))
BROWS = (slice(160, 206), slice(176, 336))


@pytest.fixture(scope="module")
def avatar() -> Iterator[ProceduralAvatar]:
    yield ProceduralAvatar()


def sha(frame: Frame) -> str:
    return hashlib.sha256(frame.tobytes()).hexdigest()


def diff(a: Frame, b: Frame) -> float:
    """Mean absolute difference, 0..255."""
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def dark_centroid_x(frame: Frame) -> float:
    """Mean column of the dark iris/pupil pixels in the left eye."""
    eye = frame[LEFT_EYE].astype(np.int32).sum(axis=2)
    _, cols = np.nonzero(eye < 200)
    assert cols.size > 20
    return float(cols.mean())


SPEAKING_STATE = Pose(
    "ada",
    viseme=10,
    viseme_weight=0.8,
    expression="speaking",
    blink=0.3,
    head_yaw=2.2,
    head_pitch=-1.1,
    head_roll=1.7,
    gaze_x=0.3,
    gaze_y=-0.2,
)


def test_frames_are_read_only_rgb_of_the_configured_size(avatar: ProceduralAvatar) -> None:
    frame = avatar.render(Pose("ada"))
    assert avatar.size == (512, 512)
    assert frame.shape == (512, 512, 3) and frame.dtype == np.uint8
    assert frame.flags.c_contiguous and not frame.flags.writeable
    with pytest.raises(ValueError):
        frame[0, 0, 0] = 1


def test_the_same_state_gives_the_same_bytes_even_in_a_fresh_renderer(
    avatar: ProceduralAvatar,
) -> None:
    first = sha(avatar.render(SPEAKING_STATE))
    assert sha(avatar.render(SPEAKING_STATE)) == first
    fresh = ProceduralAvatar()
    fresh.render(Pose("ada", viseme=3, viseme_weight=0.5))  # other cache contents first
    assert sha(fresh.render(SPEAKING_STATE)) == first


def test_nearby_states_share_a_quantised_frame(avatar: ProceduralAvatar) -> None:
    a = avatar.render(Pose("ada", gaze_x=0.3, head_yaw=1.0))
    b = avatar.render(Pose("ada", gaze_x=0.301, head_yaw=1.01))
    assert a is b


def test_every_viseme_changes_the_mouth_and_only_the_mouth(avatar: ProceduralAvatar) -> None:
    rest = avatar.render(Pose("ada", expression="speaking"))
    mouths = {sha(np.ascontiguousarray(rest[MOUTH]))}
    for viseme in range(1, len(VISEME_NAMES)):
        frame = avatar.render(Pose("ada", viseme=viseme, viseme_weight=1.0, expression="speaking"))
        assert diff(frame[MOUTH], rest[MOUTH]) > 2.0, VISEME_NAMES[viseme]
        outside = frame.copy()
        outside[MOUTH] = rest[MOUTH]
        assert np.array_equal(outside, rest), f"{VISEME_NAMES[viseme]} drew outside the mouth"
        mouths.add(sha(np.ascontiguousarray(frame[MOUTH])))
    assert len(mouths) == len(VISEME_NAMES)  # 15 different mouth shapes


def test_viseme_weight_blends_toward_rest(avatar: ProceduralAvatar) -> None:
    rest = avatar.render(Pose("ada", expression="speaking"))
    zero = avatar.render(Pose("ada", viseme=10, viseme_weight=0.0, expression="speaking"))
    half = avatar.render(Pose("ada", viseme=10, viseme_weight=0.5, expression="speaking"))
    full = avatar.render(Pose("ada", viseme=10, viseme_weight=1.0, expression="speaking"))
    assert np.array_equal(zero, rest)
    assert 1.0 < diff(half[MOUTH], rest[MOUTH]) < diff(full[MOUTH], rest[MOUTH])


def test_a_blink_closes_the_eyes(avatar: ProceduralAvatar) -> None:
    def whites(frame: Frame) -> int:
        eyes = frame[EYES].astype(np.int32)
        return int(((eyes.min(axis=2) > 210) & (np.ptp(eyes, axis=2) < 30)).sum())

    for look in avatar.appearances:
        open_ = avatar.render(Pose(look))
        half = avatar.render(Pose(look, blink=0.5))
        shut = avatar.render(Pose(look, blink=1.0))
        assert whites(open_) > 120
        assert whites(open_) > whites(half) > whites(shut)
        assert whites(shut) == 0


def test_gaze_and_yaw_move_the_iris_toward_the_viewers_right(avatar: ProceduralAvatar) -> None:
    ahead = dark_centroid_x(avatar.render(Pose("ada")))
    assert dark_centroid_x(avatar.render(Pose("ada", gaze_x=1.0))) > ahead + 3
    assert dark_centroid_x(avatar.render(Pose("ada", gaze_x=-1.0))) < ahead - 3
    assert dark_centroid_x(avatar.render(Pose("ada", head_yaw=6.0))) > ahead + 3


def test_expressions_set_the_brows_and_eyes(avatar: ProceduralAvatar) -> None:
    frames = {
        e: avatar.render(Pose("milo", expression=e))
        for e in ("idle", "listening", "thinking", "speaking")
    }
    for e in ("listening", "thinking", "speaking"):
        assert diff(frames[e][BROWS], frames["idle"][BROWS]) > 1.0, e


@pytest.mark.parametrize("mood", ["smile", "surprise"])
def test_the_gesture_moods_render_and_differ_from_idle(avatar: ProceduralAvatar, mood: str) -> None:
    for look in avatar.appearances:
        idle = avatar.render(Pose(look))
        frame = avatar.render(Pose(look, expression=mood))
        assert frame.shape == idle.shape
        assert diff(frame[MOUTH], idle[MOUTH]) > 1.0, (look, mood)  # a grin, an open "oh"
        assert diff(frame[EYES], idle[EYES]) > 1.0, (look, mood)  # narrowed, wide
        assert diff(frame[BROWS], idle[BROWS]) > 1.0, (look, mood)
        # the lip-sync still moves the mouth under the mood
        speaking = avatar.render(Pose(look, viseme=10, viseme_weight=1.0, expression=mood))
        assert diff(speaking[MOUTH], frame[MOUTH]) > 2.0, (look, mood)


def test_a_smile_lifts_the_lower_lids_and_a_surprise_opens_the_eyes(
    avatar: ProceduralAvatar,
) -> None:
    def whites(frame: Frame) -> int:
        eyes = frame[EYES].astype(np.int32)
        return int(((eyes.min(axis=2) > 210) & (np.ptp(eyes, axis=2) < 30)).sum())

    for look in avatar.appearances:
        idle = whites(avatar.render(Pose(look)))
        assert whites(avatar.render(Pose(look, expression="smile"))) < idle
        assert whites(avatar.render(Pose(look, expression="surprise"))) > idle


def test_head_roll_and_pitch_move_the_head(avatar: ProceduralAvatar) -> None:
    rest = avatar.render(Pose("ada"))
    assert diff(avatar.render(Pose("ada", head_roll=4.0)), rest) > 1.0
    assert diff(avatar.render(Pose("ada", head_pitch=5.0))[EYES], rest[EYES]) > 3.0


def test_appearances_look_clearly_different(avatar: ProceduralAvatar) -> None:
    assert avatar.appearances == ("ada", "milo")
    ada, milo = avatar.render(Pose("ada")), avatar.render(Pose("milo"))
    assert diff(ada, milo) > 20
    assert sha(avatar.render(Pose("default"))) == sha(ada)


def test_unknown_appearance_or_expression_is_rejected(avatar: ProceduralAvatar) -> None:
    with pytest.raises(ValueError, match=r"unknown avatar appearance 'zed'.*ada, milo"):
        avatar.render(Pose("zed"))
    with pytest.raises(ValueError, match="unknown expression"):
        avatar.render(Pose("ada", expression="grumpy"))
    with pytest.raises(ValueError, match="viseme id 15"):
        avatar.render(Pose("ada", viseme=15, viseme_weight=1.0))


def test_out_of_range_and_nan_inputs_are_clamped(avatar: ProceduralAvatar) -> None:
    wild = Pose("ada", viseme_weight=7.0, viseme=10, blink=math.nan, head_yaw=90, gaze_x=-5)
    tame = Pose("ada", viseme_weight=1.0, viseme=10, blink=0.0, head_yaw=10, gaze_x=-1)
    assert avatar.render(wild) is avatar.render(tame)


@pytest.mark.parametrize("size", [(128, 128), (320, 240), (360, 640)])
def test_size_is_configurable(size: tuple[int, int]) -> None:
    renderer = ProceduralAvatar(*size)
    assert renderer.size == size
    rest = renderer.render(Pose("milo"))
    speaking = renderer.render(Pose("milo", viseme=13, viseme_weight=1.0, expression="speaking"))
    assert rest.shape == (size[1], size[0], 3)
    assert diff(rest, speaking) > 0.05


def test_too_small_a_frame_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 128x128"):
        ProceduralAvatar(127, 300)


def test_concurrent_renders_match_sequential_ones() -> None:
    states = [
        Pose(
            look,
            viseme=v,
            viseme_weight=0.75,
            blink=(v % 3) / 2,
            head_roll=v / 3,
            gaze_x=0.1 * v - 0.5,
        )
        for look in ("ada", "milo")
        for v in range(0, 15, 2)
    ]
    reference = [sha(f) for f in map(ProceduralAvatar(256, 256).render, states)]
    shared = ProceduralAvatar(256, 256)
    results: dict[int, list[str]] = {}

    def work(i: int) -> None:
        order = states[i:] + states[:i]
        shas = [sha(shared.render(s)) for s in order]
        results[i] = shas[len(states) - i :] + shas[: len(states) - i]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 4
    assert all(r == reference for r in results.values())


def test_warm_draws_ahead_without_changing_frames() -> None:
    cold = ProceduralAvatar(160, 160)
    warm = ProceduralAvatar(160, 160)
    warm.warm("milo")
    for state in (
        Pose("milo", viseme=12, viseme_weight=0.625, expression="speaking"),
        Pose("milo", blink=0.75),
    ):
        assert sha(cold.render(state)) == sha(warm.render(state))
