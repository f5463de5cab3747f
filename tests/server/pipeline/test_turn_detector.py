"""The turn detector on real models (webrtcvad + Silero) and on scripted gates."""

from __future__ import annotations

import shutil
import subprocess
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.vad import SileroVad, WebRtcGate
from server.config import VadConfig
from server.pipeline.resample import resample
from server.pipeline.turn_detector import (
    TONAL_SHARE,
    TurnDetector,
    VadEvent,
    VadEventKind,
    VadState,
    line_share,
)

DATA = Path(__file__).resolve().parents[2] / "data"
RATE = 16_000


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is required (scripts/setup.sh installs it)")
    path = Path(tmp_path_factory.mktemp("vad")) / "speech.wav"
    subprocess.run(
        ["espeak-ng", "-w", str(path), "Hello there. How are you doing today?"], check=True
    )
    with wave.open(str(path)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        return resample(pcm, w.getframerate(), 16_000)


def detector(**overrides: Any) -> TurnDetector:
    config = VadConfig(**overrides)
    return TurnDetector(WebRtcGate(config.aggressiveness), SileroVad(), config)


def feed(
    det: TurnDetector, pcm: np.ndarray, chunk: int = 320, onsets: bool = False
) -> list[tuple[VadEventKind, float]]:
    """The detector's events (kind, at_ms) for ``pcm``; onsets only when asked for."""
    out = []
    for i in range(0, len(pcm), chunk):
        for event in det.push(pcm[i : i + chunk], arrival_ms=i / 16):
            if onsets or event.kind is not VadEventKind.ONSET:
                out.append((event.kind, event.at_ms))
    return out


def decisions(events: list[VadEvent]) -> list[VadEvent]:
    """Speech starts and stops (onsets left out)."""
    return [e for e in events if e.kind is not VadEventKind.ONSET]


def test_speech_between_silences_gives_one_start_and_one_stop(speech: np.ndarray) -> None:
    silence = np.zeros(16_000, np.int16)
    audio = np.concatenate([silence, speech, silence])
    events = feed(detector(end_of_turn_ms=700), audio, chunk=304)  # odd sizes, like aiortc's
    kinds = [k for k, _ in events]
    assert kinds == [VadEventKind.START, VadEventKind.STOP]
    start_ms, stop_ms = events[0][1], events[1][1]
    speech_ms = len(speech) / 16
    assert 1000 <= start_ms <= 1200  # onset of the speech, within ~200 ms
    assert 1000 + speech_ms - 400 <= stop_ms <= 1000 + speech_ms + 300


@pytest.mark.parametrize("dbfs", [-40.0, -30.0])
def test_noise_is_not_speech(dbfs: float) -> None:
    rng = np.random.default_rng(7)
    white = rng.standard_normal(16_000 * 20)
    pink = np.cumsum(rng.standard_normal(16_000 * 20))
    pink -= np.convolve(pink, np.ones(400) / 400, mode="same")  # drift removed
    for noise in (white, pink):
        scaled = noise / np.sqrt(np.mean(noise**2)) * (10 ** (dbfs / 20)) * 32767
        pcm = np.clip(scaled, -32768, 32767).astype(np.int16)
        det = detector()
        assert feed(det, pcm) == []
        assert det.state is VadState.SILENCE


def test_silence_never_runs_the_model() -> None:
    det = detector()
    feed(det, np.zeros(16_000 * 5, np.int16))
    assert det.frames == 250 and det.model_windows == 0


class ScriptedGate:
    def __init__(self, voiced: list[bool]) -> None:
        self.voiced = voiced
        self.i = 0

    def is_speech(self, frame: np.ndarray) -> bool:
        self.i += 1
        return self.voiced[self.i - 1]


class FixedProbability:
    window = 512

    def __init__(self, p: float) -> None:
        self.p = p

    def probability(self, window: np.ndarray) -> float:
        return self.p

    def reset(self) -> None:
        pass


def test_start_needs_the_configured_voiced_run_and_reports_its_arrival() -> None:
    gate = ScriptedGate([False] * 5 + [True] * 2 + [False] + [True] * 5 + [False] * 40)
    det = TurnDetector(gate, FixedProbability(0.9), VadConfig(speech_start_ms=60))
    events = []
    for i in range(len(gate.voiced)):
        events += det.push(np.ones(320, np.int16), arrival_ms=1000.0 + 20 * i)
    start = decisions(events)[0]
    assert start.kind is VadEventKind.START
    assert start.onset_arrival_ms == 1000.0 + 20 * 8  # the run that made it, not the blip
    assert start.at_ms == 8 * 20


def test_model_veto_blocks_a_gate_only_start() -> None:
    gate = ScriptedGate([True] * 50)
    det = TurnDetector(gate, FixedProbability(0.1), VadConfig())
    events = det.push(np.ones(320 * 50, np.int16), 0.0)
    assert [e.kind for e in events] == [VadEventKind.ONSET]  # the gate's voice, never confirmed


class ScriptedProbability:
    window = 512

    def __init__(self, ps: list[float]) -> None:
        self.ps = ps
        self.i = 0

    def probability(self, window: np.ndarray) -> float:
        self.i += 1
        return self.ps[min(self.i, len(self.ps)) - 1]

    def reset(self) -> None:
        pass


def test_onset_is_where_the_gate_first_heard_voice_even_if_confirmed_later() -> None:
    gate = ScriptedGate([False] * 5 + [True] * 30)
    confirm = ScriptedProbability([0.1, 0.1, 0.1] + [0.9] * 40)  # agrees a few windows late
    det = TurnDetector(gate, confirm, VadConfig(speech_start_ms=60))
    events = []
    for i in range(35):
        events += det.push(np.ones(320, np.int16), arrival_ms=1000.0 + 20 * i)
    onset, start = events[0], decisions(events)[0]
    assert start.kind is VadEventKind.START
    assert start.onset_arrival_ms == 1000.0 + 20 * 5  # gate onset, not the confirmation
    # the onset came first: the gate's first frame (vad.onset_ms 20), before the model agreed
    assert onset.kind is VadEventKind.ONSET
    assert (onset.at_ms, onset.onset_arrival_ms) == (5 * 20, 1000.0 + 20 * 5)
    assert det.gate_quiet_ms == 0.0


def test_one_onset_per_gate_run_and_the_gate_quiet_time() -> None:
    gate = ScriptedGate([True] * 3 + [False] * 4 + [True] * 1 + [False] + [True] * 2 + [False] * 3)
    det = TurnDetector(gate, FixedProbability(0.1), VadConfig(onset_ms=40))
    events = []
    for i in range(len(gate.voiced)):
        events += det.push(np.ones(320, np.int16), arrival_ms=20.0 * i)
    # a run of 3 and a run of 2 frames make onsets; the lone frame does not
    assert [(e.kind, e.at_ms) for e in events] == [
        (VadEventKind.ONSET, 0.0),
        (VadEventKind.ONSET, 9 * 20.0),
    ]
    assert det.gate_quiet_ms == 3 * 20.0


# --- tones, rings and beeps are not speech ---------------------------------------------------
TONE_S = 60


def at_dbfs(signal: np.ndarray, dbfs: float) -> np.ndarray:
    """``signal`` (float) scaled to an RMS of ``dbfs`` while it sounds, as int16."""
    loud = signal[np.abs(signal) > 1e-6]
    scaled = signal / np.sqrt(np.mean(loud**2)) * (10 ** (dbfs / 20)) * 32767
    pcm: np.ndarray = np.clip(scaled, -32768, 32767).astype(np.int16)
    return pcm


def chromium_fake_microphone() -> np.ndarray:
    """60 s of what Chromium's fake microphone (``--use-fake-device-for-media-stream`` with no
    file) sends after its audio processing: a 400 Hz beep every 500 ms with a ringing tail.
    Recorded from Chromium 156 at 16 kHz by tests/web/record_fake_mic.py; on the detector
    without the tonal rule it makes one false speech start (at 30 s)."""
    with np.load(DATA / "chromium_fake_mic.npz") as data:
        return np.asarray(data["pcm"], np.int16)


def tone_1khz(dbfs: float) -> np.ndarray:
    t = np.arange(RATE * TONE_S) / RATE
    return at_dbfs(np.sin(2 * np.pi * 1000 * t), dbfs)


def ring(dbfs: float) -> np.ndarray:
    """A telephone ring (North American: 440 + 480 Hz, 2 s on, 4 s off)."""
    t = np.arange(RATE * TONE_S) / RATE
    on = (t % 6.0) < 2.0
    return at_dbfs((np.sin(2 * np.pi * 440 * t) + np.sin(2 * np.pi * 480 * t)) * on, dbfs)


SOUNDS: dict[str, Callable[[], np.ndarray]] = {
    "chromium fake microphone": chromium_fake_microphone,
    "1 kHz tone, quiet": lambda: tone_1khz(-40.0),
    "1 kHz tone, loud": lambda: tone_1khz(-3.0),
    "ring, quiet": lambda: ring(-40.0),
    "ring, loud": lambda: ring(-3.0),
}


@pytest.mark.parametrize("sound", list(SOUNDS))
def test_tones_are_not_speech_and_speech_right_after_them_is(
    sound: str, speech: np.ndarray
) -> None:
    noise = SOUNDS[sound]()
    end_ms = len(noise) * 1000 / RATE
    assert end_ms >= (TONE_S - 1) * 1000
    audio = np.concatenate([noise, speech, np.zeros(RATE, np.int16)])
    events = feed(detector(), audio)
    starts = [at for kind, at in events if kind is VadEventKind.START]
    # nothing in the 60 s of tone; the speech that follows at once starts a turn, stamped
    # within 0.5 s of its onset (a gate run may begin in the last beep's tail)
    assert len(starts) == 1, (sound, starts)
    assert end_ms - 100 <= starts[0] <= end_ms + 500, (sound, starts)


def test_a_tone_is_judged_as_heard_not_as_the_echo_gate_left_it() -> None:
    # a steady tone heard while the avatar talks, both models calling it voice: the residual
    # echo gate (server/pipeline/echo_gate.py) gave the detector comfort noise in place of
    # every other 10 ms frame of it, which no longer looks tonal
    heard = tone_1khz(-20.0)[: 320 * 50]
    voice = heard.copy()
    for block in range(0, len(voice) // 160, 2):
        voice[block * 160 : (block + 1) * 160] = np.random.default_rng(block).normal(0, 10, 160)
    assert line_share(voice[:320]) < TONAL_SHARE <= line_share(heard[:320])
    starts = {}
    for name, raw in (("gated", None), ("heard", heard)):
        det = TurnDetector(ScriptedGate([True] * 50), FixedProbability(0.9), VadConfig())
        starts[name] = [e.kind for e in det.push(voice, 0.0, raw)].count(VadEventKind.START)
    assert starts == {"gated": 1, "heard": 0}


def test_the_gate_says_whether_its_latest_voiced_run_was_a_tone(speech: np.ndarray) -> None:
    # what the interjection judge reads when voice over a reply lapses: Chromium's fake
    # microphone's beeps are tones, the user's words are not
    beeps = chromium_fake_microphone()[: RATE * 3]
    runs = 0
    det = detector()
    for i in range(0, len(beeps) - 320 + 1, 320):
        det.push(beeps[i : i + 320], 0.0)
        if det.gate_quiet_ms == 20.0:  # a voiced run just ended: a beep with its tail
            runs += 1
            assert det.gate_tonal, i
    assert runs >= 5
    det.push(speech[: RATE // 2], 0.0)
    assert det.gate_quiet_ms < 100.0 and not det.gate_tonal


def test_line_share_tells_tones_from_speech(speech: np.ndarray) -> None:
    frames = [speech[i : i + 320] for i in range(0, len(speech) - 320, 320)]
    voiced = [f for f in frames if np.sqrt(np.mean(f.astype(np.float64) ** 2)) > 300]
    shares = sorted(line_share(f) for f in voiced)
    assert shares[len(shares) // 2] < 0.9  # speech: energy in many harmonics
    assert sum(s >= TONAL_SHARE for s in shares) <= len(shares) // 10  # a few held vowels
    assert line_share(tone_1khz(-20.0)[:320]) >= 0.99
    assert line_share(ring(-20.0)[:320]) >= 0.99
    assert line_share(np.zeros(320, np.int16)) == 0.0
    assert line_share(np.full(320, 1000, np.int16)) == 0.0  # DC is no sound


def test_quiet_ms_counts_the_pause_before_the_turn_ends(speech: np.ndarray) -> None:
    det = detector(end_of_turn_ms=700)
    feed(det, np.concatenate([np.zeros(16_000, np.int16), speech]))
    assert det.state is VadState.SPEECH
    before = det.quiet_ms
    feed(det, np.zeros(16 * 300, np.int16))  # 300 ms of silence: a pause, not yet the end
    assert det.state is VadState.SPEECH and det.quiet_ms >= before + 250
    feed(det, np.zeros(16 * 600, np.int16))  # the end of turn
    assert det.state is VadState.SILENCE and det.quiet_ms == 0.0
