"""Gestures: momentary face cues on a fake clock, and the face that shows them (no sleeps)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from models.avatar import ProceduralAvatar
from server.avatar.face import FaceAnimator
from server.avatar.gestures import AT_USER, NO_CUE, Cue, Gestures
from server.avatar.lipsync import LipSync, cues_for
from server.avatar.seam import Expression, Viseme
from server.avatar.video import AvatarVideo
from server.clock import FakeClock
from server.config import Config, RuntimeConfig
from server.conversation.looks import looks_for
from server.metrics import Metrics
from server.runtime.session import ChunkAudio, Session
from server.runtime.stage import Stage
from tests.support.tone_pipeline import tone, tone_phonemes

FRAME = 960  # 20 ms of 48 kHz audio


@pytest.fixture(scope="module")
def renderer() -> ProceduralAvatar:
    return ProceduralAvatar(128, 128)


def test_an_expression_holds_for_its_time_then_ends() -> None:
    clock = FakeClock(1000.0)
    gestures = Gestures(clock)
    assert gestures.now() == NO_CUE
    gestures.show(Expression.SMILING, 2500)
    assert gestures.at(1000.0) == Cue(Expression.SMILING, None)
    assert gestures.at(3499.9).expression is Expression.SMILING
    assert gestures.at(3500.0) == NO_CUE  # over at its end
    assert gestures.at(999.0) == NO_CUE  # not before it began
    clock.advance(2499)
    assert gestures.now().expression is Expression.SMILING
    clock.advance(1)
    assert gestures.now() == NO_CUE
    assert gestures.shown == 1


def test_the_newest_expression_wins_even_a_shorter_one() -> None:
    clock = FakeClock()
    gestures = Gestures(clock)
    gestures.show(Expression.SURPRISED, 5000)
    clock.advance(1000)
    gestures.show(Expression.SMILING, 1000)
    assert gestures.now().expression is Expression.SMILING
    clock.advance(1000)
    assert gestures.now() == NO_CUE  # the surprise it replaced does not come back


def test_a_look_and_an_expression_hold_together() -> None:
    clock = FakeClock()
    gestures = Gestures(clock)
    gestures.show(Expression.THINKING, 2500)
    clock.advance(500)
    gestures.look_at_user(2000)
    assert gestures.now() == Cue(Expression.THINKING, AT_USER) == Cue(Expression.THINKING, (0, 0))
    clock.advance(2000)  # both end at 2500
    assert gestures.now() == NO_CUE
    gestures.look_at_user(100)
    assert gestures.now() == Cue(None, AT_USER)
    gestures.clear()
    assert gestures.now() == NO_CUE


@pytest.mark.parametrize("bad", [0.0, -5.0, math.nan, math.inf])
def test_a_gesture_lasts_a_positive_finite_time(bad: float) -> None:
    gestures = Gestures(FakeClock())
    with pytest.raises(ValueError, match="positive, finite"):
        gestures.show(Expression.SMILING, bad)
    with pytest.raises(ValueError, match="positive, finite"):
        gestures.look_at_user(bad)
    assert gestures.now() == NO_CUE and gestures.shown == 0


def test_the_animator_shows_a_cue_over_the_turns_expression() -> None:
    animator = FaceAnimator(11)
    face = animator.face(0.0, "ada", Expression.SPEAKING, Viseme.AA, 0.8, shown=Expression.SMILING)
    assert face.expression is Expression.SMILING
    assert face.viseme is Viseme.AA and face.viseme_weight == 0.8  # lip-sync goes on
    idle = animator.face(40.0, "ada", Expression.IDLE, Viseme.AA, 0.8, shown=Expression.SURPRISED)
    assert idle.expression is Expression.SURPRISED
    assert idle.viseme is Viseme.SIL  # a face that does not speak keeps its mouth still


def test_looking_at_the_user_centres_the_gaze_and_faces_the_camera() -> None:
    free, looking = FaceAnimator(12), FaceAnimator(12)
    thinking = Expression.THINKING  # its gaze is up and aside: the look overrides it
    for t in range(0, 4000, 40):
        a = free.face(float(t), "ada", thinking)
        b = looking.face(float(t), "ada", thinking, look=AT_USER if t >= 2000 else None)
    assert a.gaze_x > 0.4 and a.gaze_y < -0.3
    assert b.gaze_x == pytest.approx(0, abs=0.02) and b.gaze_y == pytest.approx(0, abs=0.02)
    # the head turns to the camera: its idle sway is a tenth of the free head's, nods apart
    yaws_free, yaws_looking = [], []
    for t in range(4000, 8000, 40):
        yaws_free.append(free.face(float(t), "ada", Expression.IDLE).head_yaw)
        yaws_looking.append(looking.face(float(t), "ada", Expression.IDLE, look=AT_USER).head_yaw)
    assert max(map(abs, yaws_looking)) <= 0.1 * max(map(abs, yaws_free)) + 0.02
    assert max(map(abs, yaws_free)) > 0.5


def test_without_cues_the_face_is_as_before() -> None:
    plain, cued = FaceAnimator(13), FaceAnimator(13)
    for t in range(0, 3000, 40):
        assert plain.face(float(t), "ada", Expression.LISTENING) == cued.face(
            float(t), "ada", Expression.LISTENING, shown=None, look=None
        )


def _speaking(clock: FakeClock, lipsync: LipSync) -> Session:
    session = Session("g" * 16, RuntimeConfig(), clock)
    session.submit_text("hello")
    assert session.start_response(session.epoch)
    chunk = session.open_chunk(session.epoch, "Hello world.")
    assert chunk is not None
    pcm = tone(2000)  # the lookahead budget
    phonemes = tone_phonemes(len(pcm))
    lipsync.add_chunk(chunk.chunk_id, chunk.epoch, "ada", cues_for(phonemes, pcm))
    msg = session.message(chunk, Stage.TTS, ChunkAudio(pcm, (), phonemes, final=True))
    assert session.deliver_audio(msg) == len(pcm)
    return session


def test_the_video_shows_a_cue_while_it_lasts_and_not_after(renderer: ProceduralAvatar) -> None:
    clock, lipsync = FakeClock(), LipSync()
    session = _speaking(clock, lipsync)
    gestures = Gestures(clock)
    video = AvatarVideo(session, lipsync, FaceAnimator(14), renderer, gestures=gestures)
    faces = []
    for k in range(60):  # 60 frames of 40 ms on both clocks
        if k == 10:
            gestures.show(Expression.SMILING, 1000)
            gestures.look_at_user(1000)
        session.pull_audio(FRAME)
        session.pull_audio(FRAME)
        faces.append(video.state_at(k * 40.0))
        clock.advance(40)
    before, during, after = faces[:10], faces[10:35], faces[35:]
    assert all(f.expression is Expression.SPEAKING for f in before + after)
    assert all(f.expression is Expression.SMILING for f in during)
    assert any(f.viseme is not Viseme.SIL for f in during)  # it smiles as it speaks
    settled = faces[30]  # 800 ms into the look
    assert abs(settled.gaze_x) < 0.02 and abs(settled.gaze_y) < 0.02
    assert abs(settled.head_yaw) < 1.0
    smiling = faces[20]
    drawn = renderer.render(smiling)
    assert not np.array_equal(
        drawn, renderer.render(replace(smiling, expression=before[0].expression))
    )
    late = faces[-1]  # 1 s after the look: the gaze wanders again
    assert (late.gaze_x, late.gaze_y) != (settled.gaze_x, settled.gaze_y)


def test_each_conversation_has_its_gestures() -> None:
    clock = FakeClock()
    session = Session("h" * 16, RuntimeConfig(), clock)
    looks = looks_for(
        session, Config(), None, None, clock, Metrics(), lambda: False, lambda _: None
    )
    assert isinstance(looks.gestures, Gestures)
    looks.gestures.show(Expression.SURPRISED, 100)
    assert looks.gestures.now().expression is Expression.SURPRISED
