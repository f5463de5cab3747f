"""A semantic end of turn: an utterance that sounds complete ends after a short silence, one
that sounds unfinished (a pause mid-sentence) after a long one.

A Conversation on a fake clock with a scripted voice
(tests/server/conversation/test_interjection.py's rig) and a scripted end-of-turn model; the
real model is tested in tests/models/test_turn_model.py and measured in
benchmarks/end_of_turn_bench.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt
import pytest

from server.config import load_config
from server.conversation import hearing, partials
from server.conversation.hearing import HEARING_LATEST_MS
from server.conversation.unfinished import (
    PENDING,
    Bars,
    SentenceEnd,
    Words,
    sounds_unfinished,
    stranded,
    words_at_pause,
)
from server.pipeline.seams import ReplyRequest, Transcript
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag, ShedWork
from tests.server.conversation.test_interjection import Rig, ScriptedPipeline, Voice


class Verdicts:
    """The end-of-turn model: says ``probability`` (then each of ``later`` in turn, at the
    hearings after the first); counts what it heard."""

    def __init__(self, probability: float, *later: float) -> None:
        self.p = probability
        self.later = list(later)
        self.heard: list[int] = []

    def probability(self, pcm: npt.NDArray[np.int16]) -> float:
        if self.heard and self.later:
            self.p = self.later.pop(0)
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


async def until_judged(rig: Rig) -> None:
    """Quiet frames until the end-of-turn model (in a worker thread) has judged the
    utterance: 60 ms, then as long as its thread takes (the fake clock stands still)."""
    verdicts = rig.conversation.floor.turn_probabilities
    before = len(verdicts)
    await rig.tick(3)  # hearing.HEARINGS[0]
    for _ in range(1000):
        if len(verdicts) > before:
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the end-of-turn model never answered")


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
        # twice in the first pause (at 60 and 200 ms: unfinished both times), once in the second
        assert len(model.heard) == 3
    finally:
        await rig.conversation.close()


async def test_an_utterance_heard_again_later_in_the_pause_may_sound_complete() -> None:
    model = Verdicts(0.3, 0.97)  # unfinished at 60 ms of quiet, complete at 200 ms
    rig = Rig(completeness=model)
    try:
        await speak(rig, 40)
        silence = await quiet_until_the_turn_ends(rig, limit=100)
        # the short silence counts from the pause's start, so the second hearing ends it
        assert 200.0 <= silence <= 320.0
        assert len(model.heard) == 2
        assert model.heard[1] > model.heard[0]  # the longer silence heard too
    finally:
        await rig.conversation.close()


async def test_an_utterance_that_sounds_unfinished_twice_waits_the_long_silence() -> None:
    model = Verdicts(0.3, 0.93)  # the second hearing's bar is 0.95 (half the doubt of 0.9)
    rig = Rig(completeness=model)
    try:
        await speak(rig, 40)
        silence = await quiet_until_the_turn_ends(rig, limit=100)
        assert 1200.0 <= silence <= 1300.0
        assert len(model.heard) == 2  # at 60 and 200 ms of quiet, not again
    finally:
        await rig.conversation.close()


def test_a_later_hearing_asks_for_more_certainty() -> None:
    first, later = hearing.HEARINGS
    assert first.quiet_ms < later.quiet_ms
    assert first.sounds_complete(0.9, 0.9) and not first.sounds_complete(0.89, 0.9)
    assert later.sounds_complete(0.951, 0.9) and not later.sounds_complete(0.94, 0.9)
    assert later.sounds_complete(0.76, 0.5) and not later.sounds_complete(0.74, 0.5)


async def test_without_the_model_a_turn_ends_after_the_fixed_silence() -> None:
    rig = Rig()  # no end-of-turn model: semantic_vad falls back to vad.end_of_turn_ms
    try:
        assert rig.conversation.turn_settings.complete_wait_ms is None
        await speak(rig, 40)
        silence = await quiet_until_the_turn_ends(rig, limit=100)
        assert 600.0 <= silence <= 700.0
    finally:
        await rig.conversation.close()


class Partials(ScriptedPipeline):
    """A recogniser whose partial transcripts say ``partial`` (or are shed, ``None``), and
    ``speaking`` instead while ``voice`` is on; records the user's words each warm-up pushed,
    and whether it was told the user paused after them.
    With ``hold_first_warm_up`` (an LLM busy with other sessions) or ``hold_quiet_decodes``
    (a slow recogniser, on audio that ends in quiet) those wait until ``release`` is set."""

    def __init__(self, partial: str | None, speaking: str | None = None) -> None:
        super().__init__()
        self.partial = partial
        self.speaking = partial if speaking is None else speaking
        self.voice: Voice | None = None
        self.decodes = 0
        self.warmed: list[str] = []
        self.paused: list[bool] = []
        self.hold_first_warm_up = False
        self.hold_quiet_decodes = False
        self.held = False  # a quiet decode waited
        self.rivals: tuple[tuple[str, float], ...] = ()  # weighed in place of the last word
        self.busy = False  # a reply (any session's) is being written (seams.ReportsLoad)
        self.release = asyncio.Event()

    async def partial_transcript(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> Transcript:
        speaking = self.voice is not None and self.voice.on
        if self.hold_quiet_decodes and not speaking:
            self.held = True
            await self.release.wait()
        self.decodes += 1
        if self.partial is None:
            raise ShedWork("the engine is busy")
        assert self.speaking is not None
        return Transcript(self.speaking if speaking else self.partial, self.rivals)

    async def prefill(self, request: ReplyRequest, *, paused: bool = False) -> int:
        self.warmed.append(request.context[-1].text)
        self.paused.append(paused)
        if self.hold_first_warm_up and len(self.warmed) == 1:
            await self.release.wait()
        return 0


def rig_with(
    monkeypatch: pytest.MonkeyPatch,
    partial: str | None,
    speaking: str | None = None,
    probability: float = 0.9,
    interval_ms: int | None = None,
    recogniser: Partials | None = None,
    more: dict[str, str] | None = None,
) -> tuple[Rig, Partials]:
    """An utterance the end-of-turn model calls complete (it says 0.9) whose partial
    transcripts say ``partial`` (``speaking`` while the voice is on), every ``interval_ms``
    (None: the default), with ``more`` settings; the partial loop looks every event-loop turn
    (the rig's clock is fake)."""
    monkeypatch.setattr(partials, "PARTIAL_TICK_S", 0.0)
    recogniser = recogniser or Partials(partial, speaking)
    settings = {"pipeline.incremental": "true", **(more or {})}
    if interval_ms is not None:
        settings["pipeline.partial_interval_ms"] = str(interval_ms)
    rig = Rig(
        pipeline=lambda _: recogniser,
        settings=settings,
        completeness=Verdicts(probability),
    )
    recogniser.voice = rig.voice
    return rig, recogniser


async def test_words_that_stop_mid_sentence_keep_a_complete_sounding_turn_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, recogniser = rig_with(monkeypatch, "I would like to go to")
    try:
        await speak(rig, 40)
        silence = await quiet_until_the_turn_ends(rig, limit=100)
        assert 1200.0 <= silence <= 1300.0  # vad.incomplete_silence_ms
        assert recogniser.decodes >= 2  # while speaking, and the pause's
        # the words outrank the model: it is not asked (it would have called it complete)
        assert list(rig.conversation.floor.turn_probabilities) == []
    finally:
        await rig.conversation.close()


async def test_a_finished_sentence_ends_after_the_short_silence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, _ = rig_with(monkeypatch, "I would like to go to Paris next summer.")
    try:
        await speak(rig, 40)
        assert 160.0 <= await quiet_until_the_turn_ends(rig) <= 260.0
    finally:
        await rig.conversation.close()


async def quiet_until_decoded(rig: Rig, recogniser: Partials, limit: int = 10) -> float:
    """Quiet frames until the partial loop begins another decode (the pause's); returns the
    quiet (ms) at which it did."""
    rig.voice.on = False
    decodes = recogniser.decodes
    for n in range(1, limit + 1):
        await rig.tick()
        await asyncio.sleep(0.01)
        if recogniser.decodes > decodes:
            assert recogniser.decodes == decodes + 1
            return n * 20.0
    raise AssertionError("the pause was never decoded")


async def test_the_pause_is_decoded_at_40_ms_of_quiet_as_the_audio_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the loop looks again as each frame is judged, not at a tick of its own (an hour here)
    rig, recogniser = rig_with(monkeypatch, "I would like to go to Paris.", "I would like")
    monkeypatch.setattr(partials, "PARTIAL_TICK_S", 3600.0)
    try:
        await speak(rig, 40)
        # not at 20 ms of quiet (maybe a gap between two words): at turn_detector.PAUSE_MS
        assert await quiet_until_decoded(rig, recogniser) == 40.0
        assert rig.conversation.partials.partial.text == "I would like to go to Paris."
    finally:
        await rig.conversation.close()


async def test_while_a_reply_is_being_written_the_pause_is_decoded_at_100_ms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # another session's reply is being written: no decode and verdict at a short gap
    rig, recogniser = rig_with(monkeypatch, "I would like to go to Paris.", "I would like")
    recogniser.busy = True
    try:
        await speak(rig, 40)
        assert await quiet_until_decoded(rig, recogniser) == 100.0  # partials.BUSY_PAUSE_MS
    finally:
        await rig.conversation.close()


async def test_the_pause_that_ends_the_turn_is_not_warmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the reply starts right after the pause's words: a warm-up of them would still be
    # running, and the reply would wait for it, then read its last token in a second pass
    rig, recogniser = rig_with(monkeypatch, "I would like to go to Paris.", "I would like")
    try:
        await speak(rig, 40)
        await until_judged(rig)  # the pause's words came at 40 ms, before it judged
        await quiet_until_the_turn_ends(rig)
        assert recogniser.warmed and set(recogniser.warmed) == {"I would like"}
    finally:
        await rig.conversation.close()


async def test_a_running_warm_up_does_not_go_on_to_the_words_that_end_the_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, recogniser = rig_with(monkeypatch, "I would like to go to Paris.", "I would like")
    recogniser.hold_first_warm_up = True
    try:
        await speak(rig, 40)  # the warm-up of "I would like" runs on
        await until_judged(rig)
        await rig.tick(3)  # 120 ms of quiet: the pause's words, the turn not yet ended
        assert rig.conversation.session.state is TurnState.USER_SPEAKING
        recogniser.release.set()  # the warm-up ends before the reply starts
        await rig.tick()
        await quiet_until_the_turn_ends(rig)
        assert recogniser.warmed == ["I would like"]
    finally:
        await rig.conversation.close()


async def test_no_warm_up_of_a_partials_words_once_the_turn_is_ending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a decode begun before the pause (40 ms of quiet) heard the whole question, but the turn
    # sounds complete and ends on its words, left to the reply
    paris = "I would like to go to Paris"
    rig, recogniser = rig_with(monkeypatch, paris + ".", paris, interval_ms=50)
    recogniser.hold_quiet_decodes = True
    try:
        rig.voice.on = True
        await rig.tick(30)  # "I would like to go to Paris" warmed while speaking
        assert recogniser.warmed == ["I would like to go to Paris"]
        decodes = recogniser.decodes
        while recogniser.decodes == decodes:  # a decode every 60 ms: one begins
            await rig.tick()
        await rig.tick()  # and a frame of speech it did not hear: the next decode hears quiet
        rig.voice.on = False
        await rig.tick(3)  # 60 ms of quiet: the pause's words are coming, the model waits
        assert recogniser.held and rig.conversation.detector.quiet_ms < 100.0
        assert not rig.conversation.floor.turn_probabilities
        recogniser.release.set()  # "... Paris.": the words grow by a mark
        await quiet_until_the_turn_ends(rig)
        assert recogniser.warmed == ["I would like to go to Paris"]
    finally:
        await rig.conversation.close()


class Growing(Partials):
    """While the voice is on, each decode says one more word of "I would like to go to Paris
    next summer" ("I would" first); the ``held``-th of those waits for ``release``. In quiet,
    ``partial``."""

    WORDS = ("I", "would", "like", "to", "go", "to", "Paris", "next", "summer")

    def __init__(self, partial: str, held: int) -> None:
        super().__init__(partial)
        self.held_at = held
        self.speaking_decodes = 0

    async def partial_transcript(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> Transcript:
        if self.voice is None or not self.voice.on:
            return await super().partial_transcript(utterance, tag, prefix)
        self.speaking_decodes += 1
        n = self.speaking_decodes
        if n == self.held_at:
            self.held = True
            await self.release.wait()
        self.decodes += 1
        return Transcript(" ".join(self.WORDS[: n + 1]))


async def test_a_partials_words_are_warmed_but_those_that_come_back_in_a_pause_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a decode begun in speech returns after the user paused: its words are not warmed, the
    # pause's decode follows at once (and is not slowed by a warm-up); its words are
    recogniser = Growing("I would like to go to", held=3)
    rig, _ = rig_with(monkeypatch, None, interval_ms=50, recogniser=recogniser)
    try:
        rig.voice.on = True
        for _ in range(100):
            await rig.tick()
            if recogniser.held:
                break
        assert recogniser.held  # "I would like to" on its way; "I would like" warmed
        await rig.tick(2)  # speech the held decode did not hear
        rig.voice.on = False
        await rig.tick(8)  # 160 ms of quiet: a pause
        recogniser.release.set()
        await rig.tick(3)
        await asyncio.sleep(0.01)
        assert rig.conversation.session.state is TurnState.USER_SPEAKING  # words unfinished
        assert recogniser.warmed == ["I would", "I would like", "I would like to go to"]
        assert recogniser.paused == [False, False, True]
    finally:
        await rig.conversation.close()


class StopsAfterItsPrefix(Partials):
    """Moonshine on "What is the difference between a frog and a toad?": while the voice is
    on, each decode hears one more word (the stable words lag one behind); in quiet, given
    the stable words, it writes them and ends; given none, it hears them all."""

    WORDS = ("What", "is", "the", "difference", "between", "a", "frog", "and", "a", "toad?")

    def __init__(self) -> None:
        super().__init__(" ".join(self.WORDS))
        self.prefixes: list[str] = []
        self.speaking_decodes = 0

    async def partial_transcript(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> Transcript:
        self.decodes += 1
        if self.voice is not None and self.voice.on:
            self.speaking_decodes += 1
            return Transcript(" ".join(self.WORDS[: 2 + self.speaking_decodes]))
        self.prefixes.append(prefix)
        return Transcript(f"{prefix}?" if prefix else " ".join(self.WORDS))


async def test_a_decode_that_ends_after_its_stable_words_is_done_again_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recogniser = StopsAfterItsPrefix()
    rig, _ = rig_with(monkeypatch, None, interval_ms=200, recogniser=recogniser)
    try:
        await speak(rig, 41)  # 20 ms more than the last decode heard: the pause is decoded
        assert recogniser.speaking_decodes >= 2
        stable = rig.conversation.partials.stable  # the words the last two partials agree on
        assert 0 < len(stable.split()) < len(rig.conversation.partials.partial.text.split())
        for _ in range(10):
            await rig.tick()
            await asyncio.sleep(0.01)
            if len(recogniser.prefixes) >= 2:
                break
        # the pause's decode after the stable words heard fewer words than the last partial:
        # ("What is the difference?"); again without them, the whole question
        assert recogniser.prefixes == [stable, ""]
        assert rig.conversation.partials.partial.text == " ".join(StopsAfterItsPrefix.WORDS)
    finally:
        await rig.conversation.close()


@pytest.mark.parametrize(
    ("partial", "probability"),
    [
        ("I would like to go to", 0.9),  # the words stop mid-sentence: the turn goes on
        ("I would like to go to Paris.", 0.1),  # it does not sound complete
    ],
)
async def test_a_pause_that_may_not_end_the_turn_is_warmed(
    monkeypatch: pytest.MonkeyPatch, partial: str, probability: float
) -> None:
    # without an early reply, which would read the complete words in place of a warm-up
    # (tests/server/conversation/test_early_reply.py)
    no_early = {"pipeline.early_reply": "false"}
    rig, recogniser = rig_with(monkeypatch, partial, "I would like", probability, more=no_early)
    try:
        await speak(rig, 40)
        await rig.tick(15)  # the pause: its decode, and its warm-up
        await asyncio.sleep(0.01)
        assert rig.conversation.session.state is TurnState.USER_SPEAKING
        assert recogniser.warmed[0] == "I would like" and recogniser.warmed[-1] == partial
        # while speaking, the turn is left open; the pause's words may be all of it
        assert recogniser.paused[0] is False and recogniser.paused[-1] is True
    finally:
        await rig.conversation.close()


async def test_without_the_pauses_words_the_turn_waits_for_them_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, recogniser = rig_with(monkeypatch, None)  # every partial shed: the engine is busy
    try:
        await speak(rig, 40)
        silence = await quiet_until_the_turn_ends(rig, limit=100)
        assert 600.0 <= silence <= 700.0  # WORDS_WAIT_MS, not the long silence
        assert recogniser.decodes > 0
    finally:
        await rig.conversation.close()


class Judging(Partials):
    """A recogniser (``Partials``) and an LLM that says ``sentence_end`` for the words at a
    pause (``hold_verdicts``: not until ``release`` is set); records the words it judged."""

    def __init__(self, partial: str, sentence_end: float) -> None:
        super().__init__(partial, "How far")
        self.sentence_end_p = sentence_end
        self.judged: list[str] = []
        self.hold_verdicts = False

    async def sentence_end(self, request: ReplyRequest) -> float | None:
        self.judged.append(request.context[-1].text)
        if self.hold_verdicts:
            await self.release.wait()
        return self.sentence_end_p


@pytest.mark.parametrize(
    ("probability", "sentence_end", "silence_ms", "hearings"),
    [
        # the words are a whole sentence: the turn ends on them, the model is not asked
        (0.3, 0.6, (160, 300), 0),
        (0.9, 0.1, (160, 300), 1),  # the words leave it to the model, which agrees
        (0.9, 0.01, (1200, 1300), 0),  # the words are a fragment: the model is not asked
        (0.3, 0.1, (1200, 1300), 2),  # neither is sure enough (heard again at 200 ms)
    ],
)
async def test_the_llms_verdict_on_the_words_decides_with_the_model(
    monkeypatch: pytest.MonkeyPatch,
    probability: float,
    sentence_end: float,
    silence_ms: tuple[int, int],
    hearings: int,
) -> None:
    words = "How far away is the moon?"
    judging = Judging(words, sentence_end)
    rig, _ = rig_with(monkeypatch, words, probability=probability, recogniser=judging)
    model = rig.conversation.detector.completeness
    assert isinstance(model, Verdicts)
    try:
        await speak(rig, 40)
        low, high = silence_ms
        assert low <= await quiet_until_the_turn_ends(rig, limit=100) <= high
        assert judging.judged == [words]  # once, on the pause's words
        assert len(model.heard) == hearings
    finally:
        await rig.conversation.close()


@pytest.mark.parametrize(("latest_ms", "hearings"), [(HEARING_LATEST_MS, 0), (0.0, 1)])
async def test_the_model_hears_a_pause_at_once_only_where_set_so(
    monkeypatch: pytest.MonkeyPatch, latest_ms: float, hearings: int
) -> None:
    # hearing_latest_ms 0 (end_of_turn_bench --ablate words-first): the model hears the pause
    # at 60 ms of quiet whatever the words say, and the turn waits for it
    judging = Judging("How far away is the moon?", 0.6)
    rig, _ = rig_with(monkeypatch, judging.partial, probability=0.9, recogniser=judging)
    rig.conversation.floor.hearing_latest_ms = latest_ms
    model = rig.conversation.detector.completeness
    assert isinstance(model, Verdicts)
    try:
        await speak(rig, 40)
        assert 160.0 <= await quiet_until_the_turn_ends(rig, limit=100) <= 300.0
        assert len(model.heard) == hearings
    finally:
        await rig.conversation.close()


@pytest.mark.parametrize(
    ("rivals", "more", "silence_ms"),
    [
        ((("there", 0.1),), {}, (160, 300)),  # no word that ends no sentence weighed
        ((("the", 0.1), ("there", 0.1)), {}, (1200, 1300)),  # "the" may have been said
        ((("the", 0.1),), {"vad.stranded_word_probability": "0"}, (160, 300)),  # the setting off
        ((), {}, (160, 300)),  # a recogniser that does not tell
    ],
)
async def test_a_last_word_heard_where_one_ending_no_sentence_may_have_been_said_holds_the_turn(
    monkeypatch: pytest.MonkeyPatch,
    rivals: tuple[tuple[str, float], ...],
    more: dict[str, str],
    silence_ms: tuple[int, int],
) -> None:
    # "Could you explain why the..." decoded at the pause as "Could you explain why that?":
    # the LLM and the end-of-turn model both call it complete
    judging = Judging("Could you explain why that?", 0.9)
    judging.rivals = rivals
    rig, _ = rig_with(monkeypatch, judging.partial, recogniser=judging, more=more)
    try:
        await speak(rig, 40)
        low, high = silence_ms
        assert low <= await quiet_until_the_turn_ends(rig, limit=100) <= high
    finally:
        await rig.conversation.close()


async def test_no_verdict_on_a_pauses_words_once_the_speech_went_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a gap between two words, long enough to decode (a slow recogniser returns after the
    # user spoke on): the words only prefix what the user is saying, so they are warmed as in
    # speech; a verdict on them would hold the partial loop, and the next pause's decode
    judging = Judging("I would like to go to Paris.", 0.9)
    judging.hold_quiet_decodes = True
    rig, _ = rig_with(monkeypatch, judging.partial, recogniser=judging)
    try:
        await speak(rig, 40)
        await rig.tick(3)  # 60 ms of quiet: the pause's decode begins, and waits
        await asyncio.sleep(0.01)
        assert judging.held
        rig.voice.on = True  # the user speaks on
        await rig.tick(5)
        judging.hold_quiet_decodes = False
        judging.release.set()
        await rig.tick(5)
        await asyncio.sleep(0.01)
        assert judging.judged == []
        assert judging.warmed[-1] == judging.partial and judging.paused[-1] is False
        rig.voice.on = False
        assert 160.0 <= await quiet_until_the_turn_ends(rig, limit=100) <= 300.0
        assert judging.judged == [judging.partial]  # at the pause that ended the turn
    finally:
        await rig.conversation.close()


async def test_the_turn_waits_for_the_verdict_a_bounded_time_then_goes_by_the_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    judging = Judging("How far away is the moon?", 0.6)
    judging.hold_verdicts = True  # the LLM is slow
    rig, _ = rig_with(monkeypatch, judging.partial, recogniser=judging)
    try:
        await speak(rig, 40)
        spoken = rig.conversation.utterance.samples
        silence = await quiet_until_the_turn_ends(rig, limit=100)
        assert 600.0 <= silence <= 700.0  # WORDS_WAIT_MS; then the model and the mark
        assert judging.judged == [judging.partial]
        model = rig.conversation.detector.completeness
        assert isinstance(model, Verdicts)  # it heard the pause once the wait grew long
        assert [n - spoken >= 16 * HEARING_LATEST_MS for n in model.heard] == [True]
    finally:
        judging.release.set()
        await rig.conversation.close()


async def test_without_the_setting_the_llm_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    judging = Judging("I would like to go to", 0.9)
    more = {"vad.sentence_end": "false"}
    rig, _ = rig_with(monkeypatch, judging.partial, recogniser=judging, more=more)
    try:
        await speak(rig, 40)
        assert 1200.0 <= await quiet_until_the_turn_ends(rig, limit=100) <= 1300.0
        assert judging.judged == []  # the list of words that end no sentence decided
    finally:
        await rig.conversation.close()


@pytest.mark.parametrize(
    ("text", "unfinished"),
    [
        ("I would like to go to", True),  # no final mark: the voice trailed off
        ("How many people live in?", False),  # a particle may end a sentence: the model judges
        ("What is the fastest way to get to?", True),
        ("I need to buy a present for my.", True),
        ("Tell me a story about a", True),
        ("What I really want to know is...", True),
        ("Yesterday I went to the market and,", True),
        ("How much water should I?", True),
        ("Um.", True),
        ("What is the capital of France?", False),
        ("Yes, I can.", False),
        ("Hold on.", False),
        ("Can you do that?", False),
        ("", False),
    ],
)
def test_which_words_sound_unfinished(text: str, unfinished: bool) -> None:
    assert sounds_unfinished(text) is unfinished


def test_the_words_at_a_pause() -> None:
    at = 16_000  # the pause began one second into the utterance
    assert words_at_pause(at, "Go to", at, 200.0, True, 600.0) is Words.UNFINISHED
    assert words_at_pause(at + 1600, "Go home.", at, 200.0, True, 600.0) is Words.END
    # the latest partial did not hear all the speech: wait for the pause's decode, a while
    assert words_at_pause(at - 1, "Go", at, 200.0, True, 600.0) is Words.WAIT
    assert words_at_pause(at - 1, "Go", at, 600.0, True, 600.0) is Words.END
    assert words_at_pause(at - 1, "Go", at, 200.0, False, 600.0) is Words.END  # none coming


def test_the_llms_verdict_on_the_words_at_a_pause() -> None:
    at, bars = 16_000, Bars(alone=0.2, with_model=0.05)

    def words(
        text: str, verdict: SentenceEnd | None, complete: bool, quiet: float = 200.0
    ) -> Words:
        return words_at_pause(at, text, at, quiet, True, 600.0, verdict, complete, bars)

    sure, fair, low = (
        SentenceEnd("Go home", 0.5),
        SentenceEnd("Go home", 0.1),
        SentenceEnd("Go home", 0.01),
    )
    assert words("Go home", sure, complete=False) is Words.END  # it outranks the model
    assert words("Go home", fair, complete=True) is Words.END
    assert words("Go home", fair, complete=False) is Words.UNFINISHED
    assert words("Go home", low, complete=True) is Words.UNFINISHED
    assert words("Go home", PENDING, complete=True) is Words.WAIT
    assert words("Go home.", PENDING, complete=True, quiet=600.0) is Words.END  # the mark, then
    # a verdict on other words, or none the LLM could give: the words themselves
    assert words("Go to", SentenceEnd("Go home", 0.9), complete=True) is Words.UNFINISHED
    assert words("Go home.", SentenceEnd("Go home.", None), complete=True) is Words.END
    assert words("Go home.", None, complete=False) is Words.UNFINISHED  # the model alone
    # a filler after the words holds the turn, whatever the LLM made of them ("Uh-huh." is
    # how Whisper often writes an "uh"); a filler alone is a whole turn
    serves = "Can you recommend a restaurant that serves? Uh-huh."
    assert words(serves, SentenceEnd(serves, 0.9), complete=True) is Words.UNFINISHED
    assert words("Go home, um", SentenceEnd("Go home, um", 0.5), complete=True) is Words.UNFINISHED
    assert words("Uh-huh.", SentenceEnd("Uh-huh.", 0.9), complete=True) is Words.END
    assert words("Tell me, huh?", SentenceEnd("Tell me, huh?", 0.9), complete=True) is Words.END


def test_a_word_ending_no_sentence_weighed_last() -> None:
    # what Whisper weighed in place of the last word: "that" or "the" ("invented the...")
    assert stranded("Do you know who invented that?", (("the", 0.05), ("this", 0.2))) == 0.05
    assert stranded("We went to the beach end.", (("and", 0.03), ("an", 0.01))) == 0.04
    assert stranded("Remind me tomorrow.", (("to", 0.3),)) == 0.0  # "to" begins "tomorrow"
    assert stranded("Go to", (("to", 0.3),)) == 0.0  # the written word itself
    assert stranded("...", (("the", 0.3),)) == 0.0  # no word


def test_a_doubted_last_word_outranks_the_llm_and_its_wait() -> None:
    at, bars = 16_000, Bars(stranded=0.02)
    the = (("the", 0.02),)

    def words(verdict: SentenceEnd | None, rivals: tuple[tuple[str, float], ...]) -> Words:
        return words_at_pause(at, "Go home.", at, 200.0, True, 600.0, verdict, True, bars, rivals)

    sure = SentenceEnd("Go home.", 0.9)
    assert words(sure, the) is Words.UNFINISHED
    assert words(sure, (("the", 0.019),)) is Words.END
    assert words(PENDING, the) is Words.UNFINISHED  # no wait for a verdict that cannot help
    assert words(PENDING, (("there", 0.5),)) is Words.WAIT
    assert words(None, the) is Words.UNFINISHED  # no LLM: the same
    assert not Bars(stranded=0.0).doubts("Go home.", (("the", 0.9),))  # off
    assert Bars.of(load_config().vad) == Bars(0.2, 0.05, 0.02)  # the defaults


async def test_the_partial_loop_stops_when_cancelled_as_more_audio_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the end of the turn cancels the loop; a frame judged at that instant must not swallow
    # the cancel (asyncio.wait_for on Python 3.11 did: the turn's end then waited forever)
    rig, recogniser = rig_with(monkeypatch, "I would like to go to Paris.")
    monkeypatch.setattr(partials, "PARTIAL_TICK_S", 3600.0)
    loop = rig.conversation.partials
    try:
        task = asyncio.get_running_loop().create_task(loop.run(recogniser, lambda: False))
        await asyncio.sleep(0.01)  # it waits for audio
        loop.heard()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=1.0)
        assert task in done and task.cancelled()
    finally:
        await rig.conversation.close()
