"""Calibration: predictions and capacity from measured stage costs; unset settings follow."""

from __future__ import annotations

import dataclasses
import math

import pytest

from server.config import Config, load_config
from server.pipeline.calibration import (
    CROSS_CHECK_BUDGET_MS,
    MEDIA_CORES,
    MIN_STAGE_SHARE,
    QUOTA_USE,
    REFERENCE,
    SPEECH_S_PER_WORD,
    UTILISATION,
    VIDEO_PATH,
    StageCosts,
    adapt,
    calibrate,
    quota_use,
    with_settings,
)

FAST = StageCosts(
    asr_ms=90,
    asr_audio_ms=2300,
    llm_first_token_ms=60,
    llm_tokens_per_s=60,
    tts_ms=150,
    tts_audio_ms=2000,
    frame_ms=4,
)
SLOW = StageCosts(
    asr_ms=400,
    asr_audio_ms=2300,
    llm_first_token_ms=300,
    llm_tokens_per_s=12,
    tts_ms=700,
    tts_audio_ms=2000,
    frame_ms=30,
)


def test_every_stage_failed_falls_back_to_the_reference() -> None:
    calibration = calibrate(StageCosts(), Config(), cpus=2)
    assert set(calibration.fallbacks) == set(REFERENCE) - {"asr_audio_ms"}
    assert math.isfinite(calibration.predicted_voice_to_voice_ms)
    assert calibration.predicted_voice_to_voice_ms > 0
    assert calibration.capacity >= 1
    assert "reference figures used" in calibration.describe()


def test_nonsense_measurements_count_as_failed() -> None:
    costs = StageCosts(asr_ms=float("nan"), llm_tokens_per_s=0.0, frame_ms=-1.0)
    calibration = calibrate(costs, Config(), cpus=2)
    assert {"asr_ms", "llm_tokens_per_s", "frame_ms"} <= set(calibration.fallbacks)


def test_a_slower_machine_predicts_slower_replies_and_fewer_sessions() -> None:
    fast, slow = calibrate(FAST, Config(), 2), calibrate(SLOW, Config(), 2)
    assert slow.predicted_voice_to_voice_ms > fast.predicted_voice_to_voice_ms
    assert slow.capacity <= fast.capacity
    assert calibrate(FAST, Config(), 16).capacity > fast.capacity
    assert not fast.fallbacks


def test_every_session_carries_its_media_path_whatever_the_models_cost() -> None:
    # models that cost next to nothing: audio-only sessions are bounded by their media path
    # (Opus, RTP/SRTP, events); with video, a dearer frame fits fewer
    free = StageCosts(
        asr_ms=1,
        asr_audio_ms=2300,
        llm_first_token_ms=1,
        llm_tokens_per_s=100_000,
        tts_ms=1,
        tts_audio_ms=100_000,
        frame_ms=REFERENCE["frame_ms"],
    )
    audio_only = load_config(overrides={"transport.video": False})
    bound = math.floor(2 * UTILISATION / MEDIA_CORES)
    assert bound - 1 <= calibrate(free, audio_only, 2).capacity <= bound
    slower = dataclasses.replace(free, frame_ms=2 * REFERENCE["frame_ms"])
    assert calibrate(slower, audio_only, 2).capacity == calibrate(free, audio_only, 2).capacity
    assert calibrate(slower, Config(), 2).capacity < calibrate(free, Config(), 2).capacity


def test_partials_hide_the_transcript_in_the_end_of_turn_wait() -> None:
    baseline = load_config(overrides={"pipeline.incremental": False})
    with_partials = calibrate(FAST, Config(), 2).predicted_voice_to_voice_ms
    without = calibrate(FAST, baseline, 2).predicted_voice_to_voice_ms
    assert without > with_partials


def test_unset_settings_follow_a_slow_machine() -> None:
    config, changed = adapt(Config(), calibrate(SLOW, Config(), 1))
    assert config.pipeline.partial_interval_ms > Config().pipeline.partial_interval_ms
    assert config.pipeline.first_chunk_words < Config().pipeline.first_chunk_words
    assert config.transport.video_fps < Config().transport.video_fps
    assert config.transport.max_sessions == calibrate(SLOW, Config(), 1).capacity
    assert changed["transport.max_sessions"] == config.transport.max_sessions


def test_settings_the_operator_chose_are_kept() -> None:
    chosen = {
        "pipeline.partial_interval_ms": 300,
        "pipeline.first_chunk_words": 6,
        "transport.video_fps": 25,
        "transport.max_sessions": 4,
        "pipeline.asr_cross_check": True,
    }
    config = load_config(overrides=chosen)
    adapted, changed = adapt(config, calibrate(SLOW, config, 1))
    assert changed == {}
    assert adapted == config


def test_video_gets_smaller_when_even_ten_fps_does_not_fit() -> None:
    very_slow = StageCosts(**{**SLOW.__dict__, "frame_ms": 60.0})
    config, changed = adapt(Config(), calibrate(very_slow, Config(), 1))
    assert config.transport.video_fps == 10
    assert config.transport.video_width == config.transport.video_height == 384
    assert changed["transport.video_width"] == 384


def test_with_settings_replaces_only_what_is_named() -> None:
    config = with_settings(Config(), {"vad.end_of_turn_ms": 500, "transport.video_fps": 12})
    assert config.vad.end_of_turn_ms == 500 and config.transport.video_fps == 12
    assert config.pipeline == Config().pipeline


def test_less_cpu_time_means_fewer_frames() -> None:
    # 12 ms a frame: at 25 fps 300 ms of CPU a second; the budget is a quarter of one core,
    # or of the quota when it is less than a core
    costs = StageCosts(**{**FAST.__dict__, "frame_ms": 12.0})
    whole, _ = adapt(Config(), calibrate(costs, Config(), 2.0))
    quota, _ = adapt(Config(), calibrate(costs, Config(), 0.5))
    assert whole.transport.video_fps == 20
    assert quota.transport.video_fps == 10
    assert calibrate(costs, Config(), 0.5).capacity <= calibrate(costs, Config(), 2.0).capacity


def test_settings_follow_only_measured_stages() -> None:
    # nothing measured (a stand-in pipeline, or every warm-up call failed): nothing changes
    calibration = calibrate(StageCosts(), Config(), 0.5)
    adapted, changed = adapt(Config(), calibration)
    assert changed == {} and adapted == Config()
    # the LLM measured, the rest failed: only the LLM's setting follows
    slow_llm = StageCosts(llm_first_token_ms=900.0, llm_tokens_per_s=7.0)
    _, changed = adapt(Config(), calibrate(slow_llm, Config(), 0.5))
    assert changed == {"pipeline.first_chunk_words": 3}


def test_where_not_one_session_fits_the_video_goes_to_its_least() -> None:
    """Frames cheap enough for the video's own budget, but a conversation's reply work that
    leaves no room in 0.5 CPUs: the video gives way; on two cores it stays as it is."""
    cheap_frames = dataclasses.replace(SLOW, frame_ms=2.5)
    assert 2.5 * Config().transport.video_fps <= 0.25 * 0.5 * 1000  # the frames alone fit
    small = calibrate(cheap_frames, Config(), 0.5)
    assert small.session_cores > 0.5 * UTILISATION
    config, changed = adapt(Config(), small)
    assert config.transport.video_fps == 10
    assert (config.transport.video_width, config.transport.video_height) == (384, 384)
    assert calibrate(cheap_frames, config, 0.5).session_cores < small.session_cores
    roomy = calibrate(cheap_frames, Config(), 2.0)
    assert roomy.session_cores <= 2.0 * UTILISATION
    assert "transport.video_fps" not in adapt(Config(), roomy)[1]
    # an operator who chose the frame rate chose the video's cost: nothing about it changes
    chosen = load_config(overrides={"transport.video_fps": 25})
    kept, changed = adapt(chosen, calibrate(cheap_frames, chosen, 0.5))
    assert kept.transport.video_fps == 25 and kept.transport.video_width == 512
    assert "transport.video_width" not in changed


def test_the_sessions_own_media_slows_a_reply_where_cpu_is_short() -> None:
    """The stages were timed alone; in a conversation the session's media path and video take
    their share first: half a CPU leaves the stages much less than sixteen do."""
    audio_only = load_config(overrides={"transport.video": False})
    ref = dataclasses.replace(FAST, frame_ms=REFERENCE["frame_ms"])
    alone = calibrate(ref, audio_only, 16)
    half_cpu = calibrate(ref, audio_only, 0.5)
    with_video = calibrate(ref, Config(), 0.5)
    assert (
        alone.predicted_voice_to_voice_ms
        < half_cpu.predicted_voice_to_voice_ms
        < with_video.predicted_voice_to_voice_ms
    )
    # sixteen cores: every stage as fast as alone, the speech beside the LLM writing on too
    assert alone.stage_share == alone.speech_share == 1.0
    # half a CPU: one engine thread has what the media path leaves of the half core it had
    # alone, and while the first chunk is said the LLM's thread takes half of that
    assert half_cpu.stage_share == pytest.approx((0.5 - MEDIA_CORES) / 0.5)
    assert half_cpu.speech_share == pytest.approx((0.5 - MEDIA_CORES) / 2 / 0.5)
    # a frame so dear that media and video would take all the CPU: slow, not infinite
    dear = dataclasses.replace(FAST, frame_ms=200.0)
    dear_calibration = calibrate(dear, Config(), 0.5)
    assert dear_calibration.stage_share == dear_calibration.speech_share == MIN_STAGE_SHARE
    assert dear_calibration.predicted_voice_to_voice_ms < 20 * alone.predicted_voice_to_voice_ms


def test_the_prediction_is_each_stage_over_its_share() -> None:
    """First token and the first chunk's other tokens with one engine thread at work, the
    first chunk's speech beside the LLM writing on; the first token is counted once."""
    ref = dataclasses.replace(FAST, frame_ms=REFERENCE["frame_ms"])
    config = Config()
    words = config.pipeline.first_chunk_words
    for cpus in (16.0, 2.0, 0.5):
        calibration = calibrate(ref, config, cpus)
        first_token = 60.0  # FAST's, on a prompt cached but for the last words
        other_tokens = (words * 1.3 - 1) / 60.0 * 1000
        speech = words * SPEECH_S_PER_WORD * 1000 * (150 / 2000)
        expected = (
            (first_token + other_tokens) / calibration.stage_share
            + speech / calibration.speech_share
            + 20.0
        )
        assert calibration.predicted_voice_to_voice_ms == pytest.approx(expected)
    # two cores: the LLM on one, the speech with the media path and video on the other
    two = calibrate(ref, config, 2.0)
    assert two.stage_share == 1.0 and 0.8 < two.speech_share < 1.0


def test_a_quota_spread_over_more_cores_is_not_spent_whole() -> None:
    """Under a CFS quota, threads spread over more cores than it needs spend QUOTA_USE of
    it (a period's quota runs out while some of them wait): the same half CPU predicts
    slower replies; on ceil(quota) cores (as the CPU plan confines them) they spend it all."""
    audio_only = load_config(overrides={"transport.video": False})
    ref = dataclasses.replace(FAST, frame_ms=REFERENCE["frame_ms"])
    assert quota_use(0.5, 2) == QUOTA_USE and quota_use(2.5, 8) == QUOTA_USE
    assert quota_use(0.5, 1) == 1.0 and quota_use(2.5, 3) == 1.0  # confined
    assert quota_use(None, 2) == 1.0 and quota_use(4.0, 2) == 1.0  # no quota that binds
    cores = calibrate(ref, audio_only, 0.5)
    spread = calibrate(ref, audio_only, 0.5, quota_use(0.5, 2))
    assert spread.stage_share == pytest.approx((0.5 * QUOTA_USE - MEDIA_CORES) / 0.5)
    assert spread.predicted_voice_to_voice_ms > cores.predicted_voice_to_voice_ms
    confined = calibrate(ref, audio_only, 0.5, quota_use(0.5, 1))
    assert confined.predicted_voice_to_voice_ms == cores.predicted_voice_to_voice_ms
    # a quota above the work changes nothing: one engine thread still has a whole core
    assert calibrate(ref, audio_only, 4.0, QUOTA_USE).stage_share == 1.0
    with pytest.raises(ValueError, match="use"):
        calibrate(ref, audio_only, 0.5, 0.0)


def test_the_video_costs_by_its_size() -> None:
    """The frame was timed at the size configured then; a smaller video the calibration chose
    costs that much less a frame."""
    measured = dataclasses.replace(FAST, frame_ms=6.0, frame_pixels=512 * 512)
    small = load_config(overrides={"transport.video_width": 384, "transport.video_height": 384})
    big = calibrate(measured, Config(), 2.0)
    smaller = calibrate(measured, small, 2.0)
    video = VIDEO_PATH * 6.0 * Config().transport.video_fps / 1000
    saved = video * (1 - 384 * 384 / (512 * 512))
    # (the turn's work is spread over a turn a little shorter with the smaller video: ~0.1 %)
    assert big.session_cores - smaller.session_cores == pytest.approx(saved, rel=0.01)
    # not told the size it was timed at: the configured one
    unsized = dataclasses.replace(measured, frame_pixels=None)
    assert calibrate(unsized, small, 2.0).session_cores == pytest.approx(big.session_cores)


def test_speech_in_pieces_waits_only_for_its_first_piece() -> None:
    # the first chunk (6 words, 2 s of speech) takes 2000 x 0.35 = 700 ms whole in the slow
    # profile; where the TTS gave its warm-up sentence's first piece after 250 ms, the reply's
    # first audio waits that long instead
    whole = calibrate(SLOW, Config(), 2)
    pieces = calibrate(dataclasses.replace(SLOW, tts_first_ms=250.0), Config(), 2)
    saved = whole.predicted_voice_to_voice_ms - pieces.predicted_voice_to_voice_ms
    words = Config().pipeline.first_chunk_words
    whole_speech_ms = words * SPEECH_S_PER_WORD * 1000 * (700 / 2000)
    # the 450-odd ms saved, stretched as every stage is where the session's media takes CPU
    assert saved >= whole_speech_ms - 250.0 - 1e-6
    assert saved <= (whole_speech_ms - 250.0) / MIN_STAGE_SHARE
    assert pieces.tts_first_ms == 250.0 and "first piece in 250 ms" in pieces.describe()
    assert MIN_STAGE_SHARE <= whole.stage_share < 1  # the session's media path takes some
    assert whole.tts_first_ms is None and "first piece" not in whole.describe()
    # a first piece slower than the whole chunk (a short chunk) changes nothing
    slow_piece = calibrate(dataclasses.replace(SLOW, tts_first_ms=5000.0), Config(), 2)
    assert slow_piece.predicted_voice_to_voice_ms == whole.predicted_voice_to_voice_ms
    # not measured, or nonsense: the whole chunk's time, and no stage counts as failed
    for first in (None, float("nan"), 0.0):
        other = calibrate(dataclasses.replace(SLOW, tts_first_ms=first), Config(), 2)
        assert other.predicted_voice_to_voice_ms == whole.predicted_voice_to_voice_ms
        assert not other.fallbacks


def test_the_cross_check_stays_on_only_where_a_checked_final_is_quick() -> None:
    """A final transcript heard by both recognisers costs about two; where that would take
    longer than CROSS_CHECK_BUDGET_MS the check is left off (unless the operator set it)."""
    fast = calibrate(FAST, Config(), 2)
    assert fast.asr_call_ms <= CROSS_CHECK_BUDGET_MS
    assert "pipeline.asr_cross_check" not in adapt(Config(), fast)[1]
    slow = calibrate(SLOW, Config(), 1)
    assert slow.asr_call_ms > CROSS_CHECK_BUDGET_MS
    config, changed = adapt(Config(), slow)
    assert changed["pipeline.asr_cross_check"] is False and not config.pipeline.asr_cross_check
    kept = load_config(overrides={"pipeline.asr_cross_check": "true"})
    assert adapt(kept, calibrate(SLOW, kept, 1))[0].pipeline.asr_cross_check
    unmeasured = dataclasses.replace(SLOW, asr_ms=None)  # the reference figure: nothing changes
    assert "pipeline.asr_cross_check" not in adapt(Config(), calibrate(unmeasured, Config(), 1))[1]


def test_partials_are_paced_by_what_a_partial_costs_not_a_checked_final() -> None:
    checked = dataclasses.replace(SLOW, asr_ms=400, asr_partial_ms=120)
    alone = calibrate(checked, Config(), 1)
    assert alone.asr_partial_ms is not None and alone.asr_partial_ms < alone.asr_call_ms
    paced = adapt(Config(), alone)[0].pipeline.partial_interval_ms
    assert paced < adapt(Config(), calibrate(SLOW, Config(), 1))[0].pipeline.partial_interval_ms
    # the partials' CPU follows the partial's cost too: more sessions fit
    assert alone.capacity >= calibrate(SLOW, Config(), 1).capacity


def test_what_the_client_hears_adds_the_turns_end_and_the_way_there() -> None:
    """The reply as heard: the end-of-turn wait (or the LLM's verdict on the words at the
    pause, where that is later) before the voice-to-voice, the way to the client after."""
    from server.pipeline.calibration import CLIENT_WAY_MS, ENDPOINT_EXTRA_MS

    fast = calibrate(FAST, Config(), cpus=2)
    wait = Config().vad.complete_silence_ms  # FAST's verdict (60 ms) comes sooner
    assert fast.predicted_heard_ms == pytest.approx(
        wait + ENDPOINT_EXTRA_MS + fast.predicted_voice_to_voice_ms + CLIENT_WAY_MS
    )
    slow_verdict = dataclasses.replace(FAST, llm_first_token_ms=400)
    judged = calibrate(slow_verdict, Config(), cpus=2)
    unjudged = calibrate(slow_verdict, load_config(None, {}, {"vad.sentence_end": "false"}), cpus=2)
    assert judged.predicted_voice_to_voice_ms == unjudged.predicted_voice_to_voice_ms
    assert judged.predicted_heard_ms - unjudged.predicted_heard_ms == pytest.approx(
        40 + 400 / judged.stage_share - wait
    )
    fixed = calibrate(FAST, load_config(None, {}, {"vad.semantic": "false"}), cpus=2)
    assert fixed.predicted_heard_ms - fixed.predicted_voice_to_voice_ms == pytest.approx(
        Config().vad.end_of_turn_ms + ENDPOINT_EXTRA_MS + CLIENT_WAY_MS
    )
