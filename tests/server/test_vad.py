"""The turn detector on real models (webrtcvad + Silero) and on scripted gates."""

from __future__ import annotations

import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

from models.vad import SileroVad, WebRtcGate
from server.config import VadConfig
from server.media import resample
from server.vad import TurnDetector, VadEventKind, VadState


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


def detector(**overrides: int) -> TurnDetector:
    config = VadConfig(**overrides)
    return TurnDetector(WebRtcGate(config.aggressiveness), SileroVad(), config)


def feed(det: TurnDetector, pcm: np.ndarray, chunk: int = 320) -> list[tuple[VadEventKind, float]]:
    out = []
    for i in range(0, len(pcm), chunk):
        for event in det.push(pcm[i : i + chunk], arrival_ms=i / 16):
            out.append((event.kind, event.at_ms))
    return out


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
    start = events[0]
    assert start.kind is VadEventKind.START
    assert start.onset_arrival_ms == 1000.0 + 20 * 8  # the run that made it, not the blip
    assert start.at_ms == 8 * 20


def test_model_veto_blocks_a_gate_only_start() -> None:
    gate = ScriptedGate([True] * 50)
    det = TurnDetector(gate, FixedProbability(0.1), VadConfig())
    assert det.push(np.ones(320 * 50, np.int16), 0.0) == []


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
    assert events[0].kind is VadEventKind.START
    assert events[0].onset_arrival_ms == 1000.0 + 20 * 5  # gate onset, not the confirmation
