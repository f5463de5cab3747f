"""Smart Turn v3.2 (models.turn): its features equal pipecat's reference implementation, and on
espeak-ng speech a complete question reads as a finished turn, a cut-off fragment less so."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest

from models.turn import WINDOW, SmartTurn, log_mel, smart_turn_model_path
from server.pipeline.resample import resample
from tests.support.speech import speak

COMPLETE = "What is the capital of France?"
FRAGMENT = "I would like to go to the"
SENTENCE = "I would like to go to the cinema tonight."

Features = Callable[..., npt.NDArray[np.float32]]


def speech_16k(text: str) -> npt.NDArray[np.int16]:
    """``text`` spoken by espeak-ng, at 16 kHz mono int16."""
    return resample(speak(text), 48_000, 16_000)


def as_window(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.float32]:
    """The float audio the model reads: the last 8 s, zero-padded at the start."""
    audio = pcm[-WINDOW:].astype(np.float32) / 32768.0
    return np.pad(audio, (WINDOW - audio.size, 0))


@pytest.fixture(scope="module")
def reference() -> Features:
    """pipecat's ``compute_whisper_log_mel_features``, loaded from its one file (importing the
    pipecat package needs dependencies that are not installed)."""
    path = smart_turn_model_path().parents[1] / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    features: Features = module.compute_whisper_log_mel_features
    return features


@pytest.fixture(scope="module")
def model() -> SmartTurn:
    return SmartTurn()


def test_model_ships_in_pipecat() -> None:
    path = smart_turn_model_path()
    assert path.name == "smart-turn-v3.2-cpu.onnx" and path.stat().st_size > 1_000_000


def test_missing_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *_: None)
    with pytest.raises(FileNotFoundError, match="pipecat-ai"):
        smart_turn_model_path()


@pytest.mark.parametrize("scale", [1e-3, 0.1, 1.0])
def test_log_mel_matches_pipecat_on_noise(reference: Features, scale: float) -> None:
    audio = (np.random.default_rng(7).standard_normal(WINDOW) * scale).astype(np.float32)
    ours = log_mel(audio)
    assert ours.shape == (80, 800) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference(audio, do_normalize=True), rtol=0, atol=1e-4)


@pytest.mark.parametrize("text", [COMPLETE, FRAGMENT])
def test_log_mel_matches_pipecat_on_speech(reference: Features, text: str) -> None:
    audio = as_window(speech_16k(text))  # mostly the zeros padding the start
    np.testing.assert_allclose(
        log_mel(audio), reference(audio, do_normalize=True), rtol=0, atol=1e-4
    )


def test_complete_question_reads_as_a_finished_turn(model: SmartTurn) -> None:
    probability = model.probability(speech_16k(COMPLETE))
    print(f"{COMPLETE!r}: {probability:.3f}")
    assert probability > 0.5


def test_cut_off_fragment_reads_as_less_finished_than_the_sentence(model: SmartTurn) -> None:
    fragment = model.probability(speech_16k(FRAGMENT))
    sentence = model.probability(speech_16k(SENTENCE))
    print(f"{FRAGMENT!r}: {fragment:.3f}, {SENTENCE!r}: {sentence:.3f}")
    assert 0.0 <= fragment < sentence <= 1.0


def test_only_the_last_eight_seconds_count(model: SmartTurn) -> None:
    speech = speech_16k(COMPLETE)
    window = np.concatenate([np.zeros(WINDOW - speech.size, np.int16), speech])
    noise = np.random.default_rng(3).integers(-8000, 8000, 3 * 16_000).astype(np.int16)
    assert model.probability(np.concatenate([noise, window])) == model.probability(window)
    assert model.probability(speech) == model.probability(window)  # padded at the start


def test_empty_audio_gives_a_probability(model: SmartTurn) -> None:
    assert 0.0 <= model.probability(np.zeros(0, np.int16)) <= 1.0


def test_inference_time(model: SmartTurn) -> None:
    """Reported, not asserted: one probability() call (features and model, one thread)."""
    speech = speech_16k(COMPLETE)
    model.probability(speech)
    runs = 10
    start = time.perf_counter()
    for _ in range(runs):
        model.probability(speech)
    print(f"SmartTurn.probability: {(time.perf_counter() - start) / runs * 1000:.1f} ms per call")
