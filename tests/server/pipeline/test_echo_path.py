"""The echo path's bookkeeping and its residual echo gate, with a scripted canceller.

The real canceller (WebRTC AEC3) on real speech is in tests/models/test_echo.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from server.conversation.utterance import Utterance
from server.pipeline.echo import FAR_KEPT, FRAME, EchoPath
from server.pipeline.echo_delay import (
    LEVEL_FLOOR_DB,
    MAX_LAG_FRAMES,
    EchoDelay,
    judge,
    loudest,
)
from server.pipeline.echo_gate import (
    ONSET_FRAMES,
    REVERB_FRAMES,
    USER_RUN_FRAMES,
    WORDS_HOLD_FRAMES,
    ResidualEchoGate,
    mean_square,
)

PCM = npt.NDArray[np.int16]
DATA = Path(__file__).resolve().parents[2] / "data"


class Scripted:
    """A canceller that records its calls and takes ``keep`` of each microphone frame."""

    def __init__(self, keep: float = 1.0) -> None:
        self.keep = keep
        self.calls: list[tuple[str, int]] = []  # (render | capture, frame's first sample)

    def render(self, frame: PCM) -> None:
        assert len(frame) == FRAME
        self.calls.append(("render", int(frame[0])))

    def capture(self, frame: PCM) -> PCM:
        assert len(frame) == FRAME
        self.calls.append(("capture", int(frame[0])))
        return (frame * self.keep).astype(np.int16)


def tone(n: int, level: float, hz: float = 440.0, rate: int = 16_000) -> PCM:
    """``n`` samples of a sine whose RMS is ``level`` (int16 units)."""
    t = np.arange(n) / rate
    wave: PCM = (np.sin(2 * np.pi * hz * t) * level * np.sqrt(2)).astype(np.int16)
    return wave


FAR = tone(FRAME, 3000.0)  # the avatar talking, as sent
ECHO = tone(FRAME, 300.0, hz=300)  # its echo: -20 dB
RESIDUAL = tone(FRAME, 10.0, hz=300)  # what the canceller leaves of it: 30 dB less


def talk(gate: ResidualEchoGate, heard: PCM, cleaned: PCM, frames: int) -> None:
    """``frames`` of the avatar talking (FAR sent), each heard as ``heard``, cleaned to
    ``cleaned``."""
    for _ in range(frames):
        gate.sent(FAR)
        gate.apply(heard, cleaned)


def gate_that_learnt_the_echo() -> ResidualEchoGate:
    """A gate after 1 s of the avatar talking with only its echo (-20 dB) coming back."""
    gate = ResidualEchoGate()
    talk(gate, ECHO, RESIDUAL, 100)
    return gate


def test_without_a_canceller_audio_passes_untouched() -> None:
    path = EchoPath(None)
    path.played(np.full(960, 1000, np.int16))
    pcm = np.arange(320, dtype=np.int16)
    cleaned = path.clean(pcm)
    assert cleaned.words is pcm and cleaned.voice is pcm and cleaned.heard is pcm
    assert path.describe()["cancelling"] is False


def test_what_was_sent_goes_in_before_what_is_heard() -> None:
    canceller = Scripted(keep=0.5)
    path = EchoPath(canceller)
    path.played(np.full(960, 5000, np.int16))  # 20 ms at 48 kHz: two 10 ms frames at 16 kHz
    words = path.clean(np.full(320, 7, np.int16)).words
    kinds = [kind for kind, _ in canceller.calls]
    assert kinds.count("render") >= 1 and kinds[-2:] == ["capture", "capture"]
    assert kinds.index("capture") > max(i for i, k in enumerate(kinds) if k == "render")
    assert len(words) == 320 and (words == 3).all()  # cancelled: the avatar was talking
    assert path.masked_ms == 0.0  # the detector got noise at the floor for the last frame
    assert EchoPath(None).masked_ms == float("inf")


def test_a_partial_frame_waits_for_the_rest() -> None:
    canceller = Scripted()
    path = EchoPath(canceller)
    first = path.clean(np.full(100, 1, np.int16)).words
    assert len(first) == 0 and canceller.calls == []
    out = path.clean(np.full(220, 2, np.int16))
    second = out.words
    assert len(second) == 320 and list(second[:100]) == [1] * 100 and (second[100:] == 2).all()
    assert (out.heard == second).all()  # the heard samples the same (the canceller kept all)


def test_audio_sent_while_nothing_was_heard_is_not_kept_forever() -> None:
    canceller = Scripted()
    path = EchoPath(canceller)
    for _ in range(50):  # a second sent while the client's microphone sent nothing
        path.played(np.full(960, 3000, np.int16))
    path.clean(np.zeros(FRAME, np.int16))
    renders = sum(kind == "render" for kind, _ in canceller.calls)
    assert renders == FAR_KEPT // FRAME  # the last 200 ms


def test_a_new_inbound_stream_starts_clean() -> None:
    canceller = Scripted()
    path = EchoPath(canceller)
    path.clean(np.zeros(100, np.int16))  # less than a frame: it waits
    path.played(np.full(960, 3000, np.int16))  # sent, not yet given to the canceller
    path.restart()
    words = path.clean(np.zeros(FRAME, np.int16)).words
    assert len(words) == FRAME  # the 100 samples left from before are gone
    assert canceller.calls == [("capture", 0)]  # and what was sent to the old stream


def test_the_canceller_rests_while_nothing_sent_can_come_back() -> None:
    """750 ms of a quiet far end (the gate's window): the frames heard pass untouched, so the
    canceller gets neither stream; a loud frame sent wakes it on the frame heard last."""
    canceller = Scripted(keep=0.5)
    path = EchoPath(canceller)
    quiet = np.full(960, 3, np.int16)  # sent: 20 ms far below the avatar talking
    window = (MAX_LAG_FRAMES + REVERB_FRAMES) // 2  # in 20 ms steps
    calls = []
    for step in range(window + 10):
        path.played(quiet)
        heard = np.full(320, step + 1, np.int16)
        out = path.clean(heard)
        assert (out.words == heard).all() and (out.voice == heard).all()
        calls.append(len(canceller.calls))
    captures = [kind for kind, _ in canceller.calls].count("capture")
    # every frame heard until 750 ms of quiet were sent (the resampler's first 20 ms is
    # short of a frame: the 38th step had them), then none
    assert captures == 2 * window and calls[window - 1] == calls[-1]
    assert path.describe()["frames_rested"] == 2 * (len(calls) - window)
    path.played(np.full(960, 3000, np.int16))  # the avatar talks again
    path.clean(np.full(320, 99, np.int16))
    woke = canceller.calls[calls[-1] :]
    assert woke[:2] == [("render", 0), ("capture", len(calls))]  # the frame heard last
    assert [kind for kind, _ in woke[2:]] == ["render"] * 2 + ["capture"] * 2


def test_the_gate_silences_a_leak_and_passes_the_user() -> None:
    gate = ResidualEchoGate()
    quiet = tone(FRAME, 2.0)
    for _ in range(20):  # the noise floor: the microphone's hiss before the avatar talks
        gate.apply(quiet, quiet)
    far = tone(FRAME, 3000.0)
    for _ in range(60):
        gate.sent(far)
    # the gain is not learnt yet: the echo could be as loud as loud speakers make it (-10 dB)
    leak = tone(FRAME, 600.0, hz=300)  # -14 dB: what a canceller relearning the path lets by
    words, voice = gate.apply(leak, leak)
    assert words is leak  # the recogniser hears what the canceller gave
    assert mean_square(voice) < mean_square(quiet) * 10  # the detector: noise at the floor
    user = tone(FRAME, 2000.0, hz=200)  # -3.5 dB
    for _ in range(USER_RUN_FRAMES - 1):  # the first frames above the bound: an echo's peak?
        _, first = gate.apply(user, user)
        assert first is not user
    assert gate.apply(user, user) == (user, user)  # the third is the user's
    assert gate.silenced == USER_RUN_FRAMES and gate.since_silenced == 1


def test_the_gate_learns_the_echo_and_opens_above_it() -> None:
    gate = gate_that_learnt_the_echo()
    assert gate.gain_db is not None and -21 <= gate.gain_db <= -19
    assert gate.echo_heard is True
    user = tone(FRAME, 1000.0, hz=200)  # -10 dB: far above the echo, below what was sent
    heard = user + ECHO
    for _ in range(USER_RUN_FRAMES - 1):  # the first frames above the bound are held back
        gate.apply(heard, user)
    assert gate.apply(heard, user) == (heard, heard)  # the canceller would damp the user
    leak = tone(FRAME, 300.0, hz=300)  # the echo let through whole: not above its own level
    _, voice = gate.apply(leak, leak)
    assert voice is not leak


def test_the_recogniser_hears_the_user_as_heard_through_their_soft_frames() -> None:
    # the canceller damps a user talking over the far end, most in their soft sounds (below
    # the echo's bound): the recogniser hears every frame as heard from the user's first loud
    # one until WORDS_HOLD_FRAMES after their last, and the canceller's output after that
    gate = gate_that_learnt_the_echo()
    user = tone(FRAME, 1000.0, hz=200)  # -10 dB: far above the echo
    loud = user + ECHO
    soft = tone(FRAME, 150.0, hz=200) + ECHO  # below the echo's bound
    damped = (soft * 0.01).astype(np.int16)  # what the canceller left of it
    for _ in range(USER_RUN_FRAMES - 1):  # the first loud frames: held back from the detector
        words, voice = gate.apply(loud, user)
        assert words is loud and voice is not loud
    assert gate.apply(loud, user) == (loud, loud)
    for _ in range(WORDS_HOLD_FRAMES):
        words, voice = gate.apply(soft, damped)
        assert words is soft and voice is not soft  # the detector hears noise at the floor
    words, _ = gate.apply(soft, damped)
    assert words is damped
    gate.apply(ECHO, RESIDUAL)
    assert gate.apply(ECHO, RESIDUAL)[0] is RESIDUAL  # the echo alone: cancelled, as before


def test_two_frames_above_the_echos_bound_are_not_the_user() -> None:
    # right after the client's playout delay moves, the canceller relearns the path and a
    # 10 ms peak of the echo may top the bound (the gain learnt, plus the margin); under a late
    # server two in a row did (a gain learnt at -15 dB where the path's was -10)
    gate = gate_that_learnt_the_echo()
    peak = tone(FRAME, 600.0, hz=300)  # -14 dB: 6 dB over the echo's gain, 3 over the bound
    for _ in range(3):  # pairs of peaks with the echo between them: never a run of three
        for _ in range(USER_RUN_FRAMES - 1):
            _, voice = gate.apply(peak, peak)
            assert voice is not peak
        _, voice = gate.apply(ECHO, RESIDUAL)
        assert voice is not ECHO
    for _ in range(USER_RUN_FRAMES - 1):
        gate.apply(peak, peak)
    assert gate.apply(peak, peak) == (peak, peak)  # a third frame in a row: the user


def test_the_user_damped_by_the_canceller_is_not_learnt_as_the_echo() -> None:
    # WebRTC's canceller damps a user talking over the far end by 10 dB and more at times (their
    # first words most): such frames are not the echo alone, and the gain must not follow them
    gate = gate_that_learnt_the_echo()
    assert gate.gain_db is not None and -21 <= gate.gain_db <= -19
    user = tone(FRAME, 4000.0, hz=200)  # +2.5 dB over what was sent
    damped = tone(FRAME, 400.0, hz=200)  # 20 dB taken from it
    talk(gate, user, damped, 5)
    talk(gate, ECHO, RESIDUAL, 200)  # the user stops; the avatar talks on (within 3 s of it)
    assert gate.gain_db is not None and -21 <= gate.gain_db <= -19  # was +2.5 dB
    gate.sent(FAR)
    for _ in range(USER_RUN_FRAMES - 1):  # the first frames above the bound are held back
        gate.apply(user, user)
    _, voice = gate.apply(user, user)
    assert voice is user  # they are heard when they talk again


def test_an_echo_that_grows_a_little_is_learnt() -> None:
    # the client's volume goes up 5 dB: the echo's frames top the bound, and are learnt
    gate = gate_that_learnt_the_echo()
    louder = tone(FRAME, 530.0, hz=300)  # -15 dB
    talk(gate, louder, RESIDUAL, 300)
    assert gate.gain_db is not None and -16 <= gate.gain_db <= -14
    _, voice = gate.apply(louder, RESIDUAL)
    assert voice is not louder


def test_without_echo_the_audio_passes_untouched() -> None:
    # a client that cancels its own echo: only its hiss comes back. The canceller, finding no
    # echo path, would keep damping the user while the avatar talks: it is bypassed
    gate = ResidualEchoGate()
    hiss = tone(FRAME, 3.0, hz=5000)
    talk(gate, hiss, hiss, 100)
    assert gate.echo_heard is False
    user = tone(FRAME, 200.0, hz=200)  # -24 dB under what is sent
    damped = (user // 8).astype(np.int16)  # what the canceller would make of it
    words, voice = gate.apply(user, damped)
    assert words is user and voice is user


def test_nothing_is_gated_while_the_avatar_is_quiet() -> None:
    gate = ResidualEchoGate()
    gate.sent(np.zeros(FRAME, np.int16))
    murmur = tone(FRAME, 20.0)
    assert gate.apply(murmur, murmur) == (murmur, murmur) and gate.silenced == 0


def syllables(frames: int, seed: int) -> list[float]:
    """A far end's level per 10 ms frame, as speech moves it: runs of talk and gaps (RMS,
    int16 units)."""
    rng = np.random.default_rng(seed)
    levels: list[float] = []
    while len(levels) < frames:
        levels += [float(rng.uniform(1000, 4000))] * int(rng.integers(5, 20))
        levels += [0.0] * int(rng.integers(2, 10))
    return levels[:frames]


def test_an_echo_that_follows_what_was_sent_is_found_and_gated() -> None:
    gate = ResidualEchoGate()
    far = syllables(400, seed=1)
    for n, level in enumerate(far):  # the echo: 120 ms later at -20 dB, half cancelled
        gate.sent(tone(FRAME, level))
        back = tone(FRAME, far[n - 12] / 10 if n >= 12 else 0.0, hz=300) + tone(FRAME, 2.0)
        gate.apply(back, (back // 2).astype(np.int16))
    assert gate.delay.echo is True and gate.delay.lag == 12 and gate.echo_heard is True
    leak = tone(FRAME, 300.0, hz=300)
    assert gate.apply(leak, leak)[1] is not leak  # hidden from the detector
    # the canceller has learnt the path: between the user's loud frames the recogniser hears
    # its output (no words hold: heard, the echo under a soft sound misleads it more)
    loud = tone(FRAME, float(max(far)), hz=200)
    soft = tone(FRAME, 100.0, hz=200)
    damped = (soft // 10).astype(np.int16)
    for _ in range(USER_RUN_FRAMES - 1):
        gate.apply(loud, loud)
    assert gate.apply(loud, loud) == (loud, loud)
    assert gate.apply(soft, damped)[0] is damped


def test_a_sound_that_does_not_follow_what_was_sent_passes_untouched() -> None:
    # a client cancelling its own echo in a room that beeps: the canceller takes much of the
    # beeps (as WebRTC's does), so the gain learnt from them is high and would hide the user
    gate = ResidualEchoGate()
    far = syllables(400, seed=2)
    beep, quiet = tone(FRAME, 3000.0, hz=1000), tone(FRAME, 2.0)
    for n, level in enumerate(far):
        gate.sent(tone(FRAME, level))
        heard = beep if n % 50 < 10 else quiet
        gate.apply(heard, (heard // 20).astype(np.int16))
    assert gate.delay.echo is False and gate.echo_heard is False
    user = tone(FRAME, 800.0, hz=200)  # under what is sent, and under the gain learnt
    assert gate.apply(user, (user // 8).astype(np.int16)) == (user, user)


def test_a_silent_microphone_stays_silent_right_after_the_user_spoke() -> None:
    # the noise floor's window still holds the user's words when the reply starts; a client
    # sending digital silence must not get noise at their level (the voice gate's onset)
    gate = ResidualEchoGate()
    words = tone(FRAME, 1500.0, hz=200)
    for _ in range(200):  # two seconds of the user talking, the avatar quiet
        gate.sent(np.zeros(FRAME, np.int16))
        gate.apply(words, words)
    far, nothing = tone(FRAME, 3000.0), np.zeros(FRAME, np.int16)
    for _ in range(20):
        gate.sent(far)
        _, voice = gate.apply(nothing, nothing)
        assert mean_square(voice) == 0.0
    assert gate.silenced == 20


def test_the_verdict_on_echo_follows_the_latest_estimates() -> None:
    # speakers that send the avatar's voice back 120 ms later, then headphones in a room
    # that beeps (nothing of the avatar comes back), then the speakers again: the verdict
    # follows most of the recent delay estimates, not the first two that found a delay (nor
    # a chance lag or two among many misses, as a beep lined up with the syllables makes)
    gate = ResidualEchoGate()
    far = syllables(2100, seed=3)
    beep, quiet = tone(FRAME, 3000.0, hz=1000), tone(FRAME, 2.0)
    verdicts = []
    for n, level in enumerate(far):
        gate.sent(tone(FRAME, level))
        if 700 <= n < 1400:
            heard = beep if n % 50 < 10 else quiet
        else:
            heard = tone(FRAME, far[n - 12] / 10, hz=300) + tone(FRAME, 2.0)
        gate.apply(heard, (heard // 20).astype(np.int16))
        verdicts.append((gate.delay.echo, gate.echo_heard))
    assert verdicts[699] == (True, True)
    assert verdicts[1399] == (False, False)
    assert verdicts[-1] == (True, True) and gate.delay.lag == 12


def test_an_echo_believed_is_believed_gone_only_when_nearly_every_estimate_misses_it() -> None:
    found, missed = [True] * 3, [False] * 5
    assert judge(found + missed, None) is None  # a few finds among misses: not judged yet
    assert judge(missed[:2], None) is False  # misses and no find: no echo
    assert judge(found[:1] + missed, False) is False  # a beep's luck now and then: still none
    assert judge(found + missed, True) is True  # an echo found: a few finds among misses keep it
    assert judge(found[:2] + missed + [False], True) is True  # two of eight: still there
    assert judge(found[:1] + missed + [False] * 2, True) is True  # one of eight: still there
    assert judge(missed + [False] * 3, True) is False  # none of eight: gone
    assert judge(found[:2] + missed[:2], False) is True  # found again by half: back
    assert judge([True], None) is None and judge([True, False], True) is True


def test_an_echo_is_found_and_stays_found_while_a_late_servers_client_plays_in_fits() -> None:
    # four replies as a server in the slow profile heard them (recorded: the levels of what
    # it sent and heard, in its order): its late sends made the client's playout run dry and
    # resume, and the echo's 10 ms levels followed what was sent less closely. The first
    # estimates missed it in three (judged "no echo" at once), half the estimates of a later
    # stretch in the fourth; the gate then let the echo through, and each reply interrupted
    # itself. The envelopes find it, and an echo found is not given up for a few misses.
    recorded = json.loads((DATA / "echo_levels_slow.json").read_text())
    for session in recorded["sessions"]:
        verdicts = replayed(session)
        assert False not in verdicts and verdicts[-1] is True


def replayed(session: dict[str, Any]) -> list[bool | None]:
    """The verdict after each frame heard, as EchoDelay judges a recorded reply's levels."""
    delay = EchoDelay()
    verdicts = []
    for call, level in zip(session["calls"], session["levels_db"], strict=True):
        if call == "s":
            delay.sent(level)
        else:
            delay.heard(level)
            verdicts.append(delay.echo)
    return verdicts


def test_an_echo_found_is_kept_while_a_late_servers_client_resumes_at_new_delays() -> None:
    # three more replies recorded in the slow profile, each of which interrupted itself: the
    # client's playout ran dry every second or two and resumed at a new delay, and after the
    # first finds the estimates (a correlation above 0.5) missed the echo seven times in a
    # row (3.5 s of the avatar talking), or three after the first; the gate, believing the
    # echo gone, let it through
    recorded = json.loads((DATA / "echo_levels_slow_fits.json").read_text())
    verdicts = [replayed(session) for session in recorded["sessions"]]
    assert all(False not in judged for judged in verdicts)
    assert all(True in judged for judged in verdicts[:2])


def test_an_envelope_is_the_loudest_level_of_the_last_frames() -> None:
    levels = np.array([0.0, 30.0, 10.0, 5.0, 1.0, 2.0])
    assert loudest(levels, 3).tolist() == [0.0, 30.0, 30.0, 30.0, 10.0, 5.0]
    assert loudest(levels, 1).tolist() == levels.tolist()
    assert loudest(np.zeros(0), 5).tolist() == []


def test_the_echo_delay_is_reported_while_the_echo_is_believed_to_come_back() -> None:
    # speakers, then headphones in a room that beeps: the estimates after the switch find
    # no delay, but the verdict holds until most of the recent ones did not; meanwhile the
    # session still reports the delay last found, and none once the verdict is "no echo"
    path = EchoPath(None)
    gate = path.gate
    far = syllables(1400, seed=4)
    beep, quiet = tone(FRAME, 3000.0, hz=1000), tone(FRAME, 2.0)
    states = []
    for n, level in enumerate(far):
        gate.sent(tone(FRAME, level))
        if n < 700:
            heard = tone(FRAME, far[n - 12] / 10 if n >= 12 else 0.0, hz=300) + tone(FRAME, 2.0)
        else:
            heard = beep if n % 50 < 10 else quiet
        gate.apply(heard, (heard // 20).astype(np.int16))
        states.append((gate.delay.echo, path.describe()["echo_delay_ms"]))
    assert states[699] == (True, 120)
    assert all(delay == 120 for echo, delay in states[700:] if echo)
    assert any(echo for echo, _ in states[900:])  # the first misses left the verdict alone
    assert states[-1] == (False, None)


def pearson_lag(far: list[float], heard: list[tuple[int, float]]) -> int | None:
    """The delay estimate's rule, one lag at a time: the shortest lag whose levels correlate
    best, above 0.5, among those with 150 frames heard and both levels moving."""
    best, best_r = None, 0.5
    for lag in range(61):
        pairs = [(far[sent - 1 - lag], level) for sent, level in heard if sent - 1 - lag >= 0]
        if len(pairs) < 150:
            break
        x, y = np.array(pairs).T
        if x.std() < 1e-6 or y.std() < 1e-6:
            continue
        r = float(np.corrcoef(x, y)[0, 1])
        if r > best_r:
            best, best_r = lag, r
    return best


def test_the_delay_estimate_is_the_best_correlated_lag() -> None:
    # every lag at once (one numpy pass on the event loop) finds what trying each in turn
    # finds: echoes 0-40 frames late, noisy and clean, a far end that never moves, and a
    # microphone that hears the echo only now and then
    # (levels below LEVEL_FLOOR_DB count as it, in both)
    rng = np.random.default_rng(5)
    for trial in range(16):
        delay, far_dbs = trial * 3 % 41, rng.normal(60.0, 10.0, 700)
        if trial % 4 == 1:
            far_dbs[:] = 60.0
        estimate, far, heard = EchoDelay(), [], []
        lags = []
        for n, level in enumerate(far_dbs):
            estimate.sent(float(level))
            far.append(max(float(level), LEVEL_FLOOR_DB))
            echo = far_dbs[n - delay] - 10 + rng.normal(0.0, 40.0 if trial % 4 == 2 else 5.0)
            if trial % 4 == 3 and n % 7:
                echo = 0.0
            heard.append((len(far), max(float(echo) if n >= delay else 0.0, LEVEL_FLOOR_DB)))
            estimate.heard(heard[-1][1])
            if estimate._since == 0:  # it estimated just now, over the last 300 heard
                lags.append((estimate.lag, pearson_lag(far, heard[-300:])))
        assert lags, trial
        found = [ours for ours, _ in lags if ours is not None]
        for ours, reference in lags:
            assert ours == (reference if reference is not None else ours)
        if trial % 4 == 0:
            assert found and found[-1] == delay


def test_the_users_soft_onset_is_heard_again_once_their_words_are_loud() -> None:
    # a session's first second: the gate does not know yet whether anything comes back, and
    # the canceller damps the user's soft first sound (below the echo's bound) to nearly
    # nothing; which frames were the onset is known only at the first loud one, so the
    # recogniser's last ONSET_FRAMES are given again as heard (the rewind), once
    path = EchoPath(Scripted(keep=0.01))
    utterance = Utterance()
    far = tone(960, 3000.0, rate=48_000)  # 20 ms of the avatar talking, as sent (48 kHz)
    quiet, soft, loud = tone(320, 30.0, 200), tone(320, 150.0, 200), tone(320, 4000.0, 200)
    rewinds = []
    said = [quiet] * 20 + [soft] * 2 + [loud] * 3
    for heard in said:
        path.played(far)
        cleaned = path.clean(heard)
        if len(cleaned.rewind):
            rewinds.append(len(cleaned.rewind))
            utterance.repair(cleaned.rewind)
        utterance.keep(cleaned.words, speaking=False)
    assert path.gate.echo_heard is None and path.gate.onset_frames == ONSET_FRAMES
    assert rewinds == [ONSET_FRAMES * FRAME]  # the frames before the first loud one, once
    assert path.describe()["onsets_heard_again"] == 1
    got = utterance.recent(200)  # the last 10 frames kept
    expected = np.concatenate(said)[-len(got) :]
    onset = len(got) - 3 * 320 - ONSET_FRAMES * FRAME  # where the rewind begins
    assert (got[onset:] == expected[onset:]).all()  # the onset and the words as heard
    assert np.abs(got[:onset]).max() <= 1  # before it: the canceller's output, as given


def test_a_repair_changes_only_the_samples_still_kept() -> None:
    utterance = Utterance()
    for n in range(3):
        utterance.keep(np.full(320, n, np.int16), speaking=False)
    utterance.repair(np.full(400, 9, np.int16))
    assert list(np.unique(utterance.recent(60), return_counts=True)[1]) == [320, 240, 400]
    utterance.begin()
    utterance.keep(np.full(320, 5, np.int16), speaking=True)
    utterance.repair(np.full(100, 7, np.int16))  # the tail of the utterance now
    audio = utterance.audio()
    assert (audio[-100:] == 7).all() and (audio[-320:-100] == 5).all()
    utterance.take()
    utterance.repair(np.full(100, 7, np.int16))  # the turn ended since: nothing kept to change
    assert utterance.samples == 0 and len(utterance.audio()) == 0
