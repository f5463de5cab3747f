"""Lip-sync cues, the face animator and the avatar video source on a fake clock (no network)."""
# ruff: noqa: RUF001  (IPA symbols)

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from models.avatar import ProceduralAvatar
from server.avatar.face import BLINK_MS, Attention, FaceAnimator
from server.avatar.lipsync import ATTACK_SAMPLES, LipSync, cues_for
from server.avatar.seam import Expression, FaceState, Viseme, viseme_of
from server.avatar.video import AvatarVideo, YuvConverter
from server.clock import FakeClock
from server.config import RuntimeConfig
from server.rtc.tracks import MediaClock
from server.runtime.chunk import PhonemeTiming
from server.runtime.media import ms_to_samples, samples_to_ms
from server.runtime.session import ChunkAudio, Session
from server.runtime.stage import Stage
from server.runtime.turn import TurnState
from tests.support.tone_pipeline import tone, tone_phonemes

FRAME = 960  # 20 ms of 48 kHz audio


@pytest.fixture(scope="module")
def renderer() -> ProceduralAvatar:
    return ProceduralAvatar(128, 128)


def test_phonemes_map_to_visemes() -> None:
    assert viseme_of("p") is Viseme.PP
    assert viseme_of("ˈa") is Viseme.AA  # stress marks ignored
    assert viseme_of("oʊ") is Viseme.O
    assert viseme_of("iː") is Viseme.I
    long_and_syllabic = [viseme_of(p) for p in ("ɑː", "ɔː", "oː", "uː", "n̩", "l̩")]  # marks go
    assert long_and_syllabic == [Viseme.AA, Viseme.O, Viseme.O, Viseme.U, Viseme.NN, Viseme.NN]
    assert viseme_of(" ") is Viseme.SIL
    assert viseme_of(",") is Viseme.SIL
    assert viseme_of("^") is Viseme.SIL


def test_cues_follow_phoneme_timings_and_merge_runs() -> None:
    phonemes = (
        PhonemeTiming("h", 0, 2400),
        PhonemeTiming("ə", 2400, 7200),
        PhonemeTiming("l", 7200, 9600),
        PhonemeTiming("oʊ", 9600, 19200),
        PhonemeTiming("p", 19200, 21600),
        PhonemeTiming("b", 21600, 24000),  # same viseme as p: one cue
        PhonemeTiming(" ", 24000, 28800),
    )
    pcm = np.concatenate([tone(100), tone(300), np.zeros(ms_to_samples(200), np.int16)])
    cues = cues_for(phonemes, pcm[:28800])
    assert [c.viseme for c in cues] == [
        Viseme.KK,
        Viseme.E,
        Viseme.NN,
        Viseme.O,
        Viseme.PP,
        Viseme.SIL,
    ]
    assert [(c.start, c.end) for c in cues] == [
        (0, 2400),
        (2400, 7200),
        (7200, 9600),
        (9600, 19200),
        (19200, 24000),
        (24000, 28800),
    ]
    assert cues[-1].weight == 0.0
    assert all(0.35 <= c.weight <= 1.0 for c in cues[:-1])
    assert cues[4].weight == 0.35  # the silent "p b" part: the smallest sounding weight


def test_events_cover_only_queued_audio_with_pts_on_the_output_clock() -> None:
    lipsync = LipSync()
    cues = cues_for(tone_phonemes(48_000), tone(1000))  # ten 100 ms cues
    lipsync.add_chunk(7, epoch=2, appearance="ada", cues=cues)
    first = lipsync.placed(7, position=96_000, queued=24_000)  # 2 s into the stream, 0.5 s queued
    assert [e["pts_ms"] for e in first] == [2000.0, 2100.0, 2200.0, 2300.0, 2400.0]
    assert all(e["epoch"] == 2 and e["type"] == "avatar.viseme" for e in first)
    rest = lipsync.placed(7, position=96_000, queued=48_000)
    assert [e["pts_ms"] for e in rest] == [2500.0, 2600.0, 2700.0, 2800.0, 2900.0]
    assert lipsync.placed(7, position=96_000, queued=48_000) == []  # each cue announced once
    assert first[0]["viseme"] == int(Viseme.KK) and first[0]["duration_ms"] == 100.0
    # the mouth shape inside the chunk ramps in over the attack, then holds
    viseme, weight = lipsync.at(7, 4800 + ATTACK_SAMPLES)
    assert viseme is Viseme.E and weight == cues[1].weight
    assert lipsync.at(7, 4800)[1] < weight
    lipsync.drop_older(3)
    assert lipsync.at(7, 4800) == (Viseme.SIL, 0.0)


def test_animator_is_deterministic_blinks_and_moves() -> None:
    def run(seed: int) -> list[tuple[float, float, float]]:
        animator = FaceAnimator(seed)
        return [
            (f.blink, f.head_yaw, f.head_pitch)
            for t in range(0, 12_000, 40)
            for f in [animator.face(float(t), "ada", Expression.IDLE)]
        ]

    a, b = run(1), run(1)
    assert a == b
    assert a != run(2)
    blinks = [blink for blink, _, _ in a]
    assert any(x > 0.5 for x in blinks), "no blink in 12 s"
    assert sum(1 for x in blinks if x > 0) * 40 < 12_000 * 0.15, "eyes closed too often"
    yaws = {yaw for _, yaw, _ in a}
    assert len(yaws) > 50, "idle head motion looks frozen"
    assert max(abs(y) for y in yaws) < 8


def test_listener_nods_after_a_phrase_and_a_pause() -> None:
    animator = FaceAnimator(3)
    t = 0.0
    for _ in range(60):  # 1.2 s of voice, 20 ms frames
        animator.hear_user(t, 0.1)
        t += 20
    assert animator.nods == 0
    for _ in range(15):  # 300 ms pause
        animator.hear_user(t, 0.001)
        t += 20
    assert animator.nods == 1
    pitches = [
        animator.face(t + dt, "ada", Expression.LISTENING).head_pitch for dt in range(0, 700, 40)
    ]
    assert max(pitches) - min(pitches) > 2.0  # the nod is visible
    # continuous voice with short gaps (< pause) does not make the listener nod
    other = FaceAnimator(3)
    t = 0.0
    for i in range(200):
        other.hear_user(t, 0.1 if i % 5 else 0.001)
        t += 20
    assert other.nods == 0


def test_gaze_follows_the_user_and_thinking_looks_aside() -> None:
    animator = FaceAnimator(4)
    face = animator.face(0.0, "ada", Expression.LISTENING, attention=Attention(-0.8, 0.0))
    for t in range(40, 2000, 40):
        face = animator.face(float(t), "ada", Expression.LISTENING, attention=Attention(-0.8, 0))
    assert face.gaze_x == pytest.approx(0.8, abs=0.05)  # mirrored: towards the user
    for t in range(2000, 4000, 40):
        face = animator.face(float(t), "ada", Expression.THINKING)
    assert face.gaze_x > 0.4 and face.gaze_y < -0.3
    assert face.viseme is Viseme.SIL  # only a speaking face moves its mouth


def _speaking_session(clock: FakeClock, lipsync: LipSync, seconds: float) -> Session:
    session = Session("s" * 16, RuntimeConfig(), clock)
    session.submit_text("hello")
    assert session.start_response(session.epoch)
    chunk = session.open_chunk(session.epoch, "Hello world.")
    assert chunk is not None
    pcm = tone(seconds * 1000)
    phonemes = tone_phonemes(len(pcm))
    lipsync.add_chunk(chunk.chunk_id, chunk.epoch, "ada", cues_for(phonemes, pcm))
    msg = session.message(chunk, Stage.TTS, ChunkAudio(pcm, (), phonemes, final=True))
    assert session.deliver_audio(msg) == len(pcm)
    return session


def test_frame_for_time_t_shows_the_viseme_of_the_audio_at_t(renderer: ProceduralAvatar) -> None:
    clock, lipsync = FakeClock(), LipSync()
    session = _speaking_session(clock, lipsync, 1.0)
    video = AvatarVideo(session, lipsync, FaceAnimator(5), renderer)
    expected = [
        Viseme.KK,
        Viseme.E,
        Viseme.NN,
        Viseme.O,
        Viseme.U,
        Viseme.E,
        Viseme.PP,
        Viseme.AA,
    ]
    for k in range(25):  # 25 video frames of 40 ms, 2 audio pulls each
        media_ms = k * 40.0
        # the video frame may ask before or after its audio frame was pulled: both must agree
        before = video.state_at(media_ms)
        session.pull_audio(FRAME)
        after = video.state_at(media_ms)
        session.pull_audio(FRAME)
        slot = int(media_ms // 100)
        want = expected[slot % len(expected)]
        assert before.viseme is after.viseme is want, (media_ms, before, after)
        assert before.expression is Expression.SPEAKING
    assert session.state is TurnState.AGENT_SPEAKING


def test_barge_in_returns_the_face_to_listening_within_one_frame(
    renderer: ProceduralAvatar,
) -> None:
    clock, lipsync = FakeClock(), LipSync()
    session = _speaking_session(clock, lipsync, 2.0)
    video = AvatarVideo(session, lipsync, FaceAnimator(6), renderer)
    for _ in range(20):
        session.pull_audio(FRAME)
    assert video.state_at(390.0).expression is Expression.SPEAKING
    session.speech_started()  # barge-in: epoch bumped, buffer flushed
    lipsync.drop_older(session.epoch)
    face = video.state_at(400.0)  # the very next frame
    assert face.expression is Expression.LISTENING and face.viseme is Viseme.SIL
    assert face.viseme_weight == 0.0


def test_underrun_keeps_idle_motion_and_a_resting_mouth(renderer: ProceduralAvatar) -> None:
    clock, lipsync = FakeClock(), LipSync()
    session = _speaking_session(clock, lipsync, 0.2)  # 200 ms queued, the reply goes on
    video = AvatarVideo(session, lipsync, FaceAnimator(7), renderer)
    faces = []
    for k in range(50):
        session.pull_audio(FRAME)
        session.pull_audio(FRAME)
        faces.append(video.state_at(k * 40.0))
    assert session.playback.underruns == 1
    gap = [f for k, f in enumerate(faces) if k * 40 >= 240]
    assert all(f.viseme is Viseme.SIL and f.expression is Expression.SPEAKING for f in gap)
    assert len({(f.head_yaw, f.head_pitch) for f in gap}) > len(gap) // 2  # not frozen
    frames = [renderer.render(f) for f in gap[:5]]
    assert all(fr.std() > 10 for fr in frames)  # a picture, never a black frame


def test_appearance_changes_at_the_chunk_boundary(renderer: ProceduralAvatar) -> None:
    clock, lipsync = FakeClock(), LipSync()
    session = Session("a" * 16, RuntimeConfig(appearance="ada"), clock)
    video = AvatarVideo(session, lipsync, FaceAnimator(8), renderer)
    session.submit_text("hi")
    assert session.start_response(session.epoch)
    first = session.open_chunk(session.epoch, "One.")
    assert first is not None
    session.request_update({"appearance": "milo"})  # mid-chunk: waits for the boundary
    for chunk_text in ("One.", "Two."):
        chunk = first if chunk_text == "One." else session.open_chunk(session.epoch, chunk_text)
        assert chunk is not None
        pcm = tone(400)
        phonemes = tone_phonemes(len(pcm))
        lipsync.add_chunk(
            chunk.chunk_id, chunk.epoch, session.conditions.appearance, cues_for(phonemes, pcm)
        )
        msg = session.message(chunk, Stage.TTS, ChunkAudio(pcm, (), phonemes, final=True))
        assert session.deliver_audio(msg) == len(pcm)
    seen = []
    for k in range(20):
        seen.append(video.state_at(k * 40.0).appearance)
        session.pull_audio(FRAME)
        session.pull_audio(FRAME)
    boundary = int(samples_to_ms(ms_to_samples(400)) // 40)
    assert seen[:boundary] == ["ada"] * boundary
    assert seen[boundary:] == ["milo"] * (20 - boundary)


def test_blink_lasts_a_few_frames() -> None:
    animator = FaceAnimator(9)
    closed = [
        t for t in range(0, 20_000, 10) if animator.face(float(t), "ada", Expression.IDLE).blink
    ]
    assert closed, "no blink in 20 s"
    runs = np.split(np.array(closed), np.where(np.diff(closed) > 10)[0] + 1)
    assert all(len(run) * 10 <= BLINK_MS + 10 for run in runs)


def test_peeking_does_not_start_the_media_clock() -> None:
    now = [5.0]
    clock = MediaClock(lambda: now[0])
    assert clock.peek_ms() is None  # inbound audio before the outbound tracks: no clock yet
    now[0] = 6.0
    assert clock.now() == 0.0  # the first outbound frame starts it
    now[0] = 6.25
    assert clock.peek_ms() == 250.0


class _CountingRenderer:
    """The real avatar, counting its draws."""

    def __init__(self, renderer: ProceduralAvatar) -> None:
        self.inner = renderer
        self.draws = 0

    @property
    def appearances(self) -> tuple[str, ...]:
        return self.inner.appearances

    @property
    def size(self) -> tuple[int, int]:
        return self.inner.size

    def warm(
        self,
        appearance: str,
        stop: threading.Event | None = None,
        pace: Callable[[], None] | None = None,
    ) -> None:
        self.inner.warm(appearance, stop, pace)

    def render(self, state: FaceState) -> npt.NDArray[np.uint8]:
        self.draws += 1
        return self.inner.render(state)


async def test_idle_frames_go_at_half_rate_only_while_engines_are_busy(
    renderer: ProceduralAvatar,
) -> None:
    counting = _CountingRenderer(renderer)
    busy = [False]
    shed: list[int] = []
    session = Session("s" * 16, RuntimeConfig(), FakeClock())
    video = AvatarVideo(
        session,
        LipSync(),
        FaceAnimator(9),
        counting,
        shed=lambda: busy[0],
        on_shed=lambda: shed.append(1),
    )
    for k in range(10):
        await video(k * 40.0)
    assert counting.draws == 10 and not shed  # idle, engines free: every frame drawn
    busy[0] = True
    for k in range(10, 20):
        frame = await video(k * 40.0)
        assert (frame.width, frame.height) == renderer.size  # a frame every time, never a gap
    assert counting.draws == 15 and len(shed) == 5


async def test_a_speaking_face_is_never_shed(renderer: ProceduralAvatar) -> None:
    counting = _CountingRenderer(renderer)
    clock, lipsync = FakeClock(), LipSync()
    session = _speaking_session(clock, lipsync, 1.0)
    video = AvatarVideo(session, lipsync, FaceAnimator(5), counting, shed=lambda: True)
    for k in range(10):
        session.pull_audio(FRAME)
        await video(k * 40.0)
        session.pull_audio(FRAME)
    assert counting.draws == 10


async def test_frames_leave_in_the_encoders_format_with_the_faces_colours(
    renderer: ProceduralAvatar,
) -> None:
    session = Session("y" * 16, RuntimeConfig(), FakeClock())
    video = AvatarVideo(session, LipSync(), FaceAnimator(10), renderer)
    frame = await video(0.0)
    assert frame.format.name == "yuv420p"  # the VP8 encoder takes it as it is
    assert (frame.width, frame.height) == renderer.size
    drawn = renderer.render(video.state_at(0.0)).astype(np.int16)
    back = frame.to_ndarray(format="rgb24").astype(np.int16)
    assert np.median(np.abs(back - drawn)) <= 3  # 4:2:0 blurs colour edges only


def test_a_picture_is_converted_on_the_calling_thread_alone() -> None:
    """libswscale's default starts slice threads for every picture (kept: for every
    converter) and the calling thread waits on them: voluntary context switches, 4 a picture
    (1 kept), none on one thread."""
    import resource

    to_yuv = YuvConverter()
    rgb = np.random.default_rng(1).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    to_yuv(rgb)
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    for _ in range(50):
        yuv = to_yuv(rgb)
    waits = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before
    assert yuv.shape == (768, 512) and yuv.dtype == np.uint8
    assert waits < 10, waits
