"""A semantic end of turn: an utterance that sounds complete ends after a short silence, one
that sounds unfinished (a pause mid-sentence) after a long one.

A Conversation on a fake clock with a scripted voice (tests/server/test_interjection.py's rig)
and a scripted end-of-turn model; the real model is tested in tests/models/test_turn_model.py
and measured in benchmarks/end_of_turn_bench.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from server.runtime.turn import TurnState
from tests.server.test_interjection import Rig


class Verdicts:
    """The end-of-turn model: says ``probability``; counts what it heard."""

    def __init__(self, probability: float) -> None:
        self.p = probability
        self.heard: list[int] = []

    def probability(self, pcm: npt.NDArray[np.int16]) -> float:
        self.heard.append(len(pcm))
        return self.p


async def quiet_until_the_turn_ends(rig: Rig, limit: int = 200) -> float:
    """Quiet frames until the user's turn ends; returns the silence (ms) it took."""
    for n in range(1, limit + 1):
        await rig.tick()
        await asyncio.sleep(0.002)  # the model runs in a worker thread
        if rig.conversation.session.state is not TurnState.USER_SPEAKING:
            return n * 20.0
    raise AssertionError("the turn never ended")


async def speak(rig: Rig, frames: int) -> None:
    rig.voice.on = True
    await rig.tick(frames)
    rig.voice.on = False
    assert rig.conversation.session.state is TurnState.USER_SPEAKING


async def test_a_complete_sounding_utterance_ends_after_the_short_silence() -> None:
    model = Verdicts(0.9)
    rig = Rig(completeness=model)
    try:
        await speak(rig, 40)
        silence = await quiet_until_the_turn_ends(rig)
        # vad.complete_silence_ms (160) and the confirming model's hysteresis; far from 1200
        assert 160.0 <= silence <= 260.0
        assert len(model.heard) == 1 and model.heard[0] > 16_000 * 0.8  # the utterance so far
        assert rig.events("input_audio_buffer.speech_stopped")
    finally:
        await rig.conversation.close()


async def test_an_unfinished_sounding_utterance_waits_the_long_silence() -> None:
    rig = Rig(completeness=Verdicts(0.1))
    try:
        await speak(rig, 40)
        silence = await quiet_until_the_turn_ends(rig, limit=100)
        assert 1200.0 <= silence <= 1300.0  # vad.incomplete_silence_ms
    finally:
        await rig.conversation.close()


async def test_speech_after_a_pause_makes_the_earlier_verdict_void() -> None:
    model = Verdicts(0.1)
    rig = Rig(completeness=model)
    try:
        await speak(rig, 30)
        await rig.tick(20)  # a 400 ms pause mid-sentence: judged unfinished, the turn goes on
        await asyncio.sleep(0.01)
        assert rig.conversation.session.state is TurnState.USER_SPEAKING
        model.p = 0.9  # "... Paris next summer.": now it sounds complete
        rig.voice.on = True
        await rig.tick(30)
        rig.voice.on = False
        silence = await quiet_until_the_turn_ends(rig)
        assert silence <= 260.0
        assert len(model.heard) == 2  # heard again at the second pause
    finally:
        await rig.conversation.close()


async def test_without_the_model_a_turn_ends_after_the_fixed_silence() -> None:
    rig = Rig()  # no end-of-turn model: semantic_vad falls back to vad.end_of_turn_ms
    try:
        assert rig.conversation.turn_settings.complete_wait_ms is None
        await speak(rig, 40)
        silence = await quiet_until_the_turn_ends(rig, limit=100)
        assert 600.0 <= silence <= 700.0
    finally:
        await rig.conversation.close()
