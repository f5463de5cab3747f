"""An early reply: begun at a pause that may not end the turn yet, played at once when the turn
ends on the same words, dropped unheard when the user speaks on or types.

A Conversation on a fake clock with a scripted voice, recogniser and end-of-turn model
(tests/server/conversation/test_end_of_turn.py's rig); server/conversation/early.py is the design.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from server.pipeline.seams import ReplyRequest, SpeechAudio, TurnTrace
from server.runtime.conditions import Conditions
from server.runtime.history import Role
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import JobTag
from tests.server.conversation.test_end_of_turn import (
    Partials,
    quiet_until_the_turn_ends,
    rig_with,
    speak,
)
from tests.server.conversation.test_interjection import REPLY, Rig

PARIS = "I would like to go to Paris."


class Replying(Partials):
    """The scripted recogniser, and an LLM and a voice that count what they were asked: each
    reply stream opened (the user's words it answers) and closed, each sentence spoken."""

    def __init__(self, partial: str, speaking: str) -> None:
        super().__init__(partial, speaking)
        self.asked: list[str] = []
        self.closed = 0
        self.spoken: list[str] = []
        self.streams: list[str] = []  # "open" and "closed", in order

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[str]:
        self.asked.append(request.context[-1].text)
        self.streams.append("open")
        try:
            trace.llm_first_token_ms = trace.endpoint_ms + 5.0
            yield "Once upon a time."
            yield "The end."
        finally:
            self.closed += 1
            self.streams.append("closed")

    async def synthesize(self, text: str, conditions: Conditions, tag: JobTag) -> SpeechAudio:
        self.spoken.append(text)
        return SpeechAudio(REPLY)


def early_rig(
    monkeypatch: pytest.MonkeyPatch,
    partial: str = PARIS,
    probability: float = 0.1,
    settings: dict[str, str] | None = None,
    interval_ms: int | None = None,
    speaking: str = "I would like",
) -> tuple[Rig, Replying]:
    """A user whose words at the pause are ``partial`` (``speaking`` before it), which the
    end-of-turn model calls complete with ``probability`` (0.1: unfinished, the long silence
    holds)."""
    recogniser = Replying(partial, speaking)
    rig, _ = rig_with(
        monkeypatch,
        partial,
        probability=probability,
        interval_ms=interval_ms,
        recogniser=recogniser,
        more=settings,
    )
    return rig, recogniser


async def pause(rig: Rig, frames: int = 15) -> None:
    """Quiet frames: the pause's decode, and what follows it."""
    await rig.tick(frames)
    await asyncio.sleep(0.01)


def outcomes(rig: Rig) -> tuple[int, int]:
    """Early replies adopted and dropped so far (/metrics)."""
    counter = rig.conversation.metrics.early_replies
    return int(counter.labels("adopted")._value.get()), int(counter.labels("dropped")._value.get())


def played(rig: Rig) -> int:
    """Frames of reply audio the track has sent."""
    return sum(1 for frame in rig.heard if frame.any())


async def test_a_pause_that_may_not_end_the_turn_begins_the_reply_unheard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, llm = early_rig(monkeypatch)
    try:
        await speak(rig, 40)
        await pause(rig, 4)  # 80 ms of quiet: the pause's words, but maybe a gap mid-sentence
        assert not llm.asked
        await pause(rig)
        conversation = rig.conversation
        assert conversation.session.state is TurnState.USER_SPEAKING  # the long silence holds
        assert llm.asked == [PARIS]  # the reply to the pause's words, begun at 100 ms of quiet
        assert llm.spoken == ["Once upon a time."]  # its first sentence, spoken ahead
        assert llm.warmed[-1] != PARIS  # it reads them itself: no warm-up of them
        assert played(rig) == 0 and not rig.events("response.created")  # nothing heard
        assert conversation.replies.early is not None
    finally:
        await rig.conversation.close()


async def test_a_partial_that_heard_all_the_speech_before_the_pause_begins_it_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a decode every 60 ms: the last one in speech hears all of it, so no decode of the pause
    # follows; its words are the pause's
    rig, llm = early_rig(monkeypatch, interval_ms=50, speaking=PARIS)
    try:
        await speak(rig, 40)
        decodes = llm.decodes
        await pause(rig)
        assert llm.decodes == decodes  # no decode of the pause
        assert llm.asked == [PARIS] and llm.spoken == ["Once upon a time."]
        assert rig.conversation.session.state is TurnState.USER_SPEAKING
    finally:
        await rig.conversation.close()


async def test_the_turn_that_ends_on_the_same_words_plays_the_early_reply_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, llm = early_rig(monkeypatch)
    try:
        await speak(rig, 40)
        await quiet_until_the_turn_ends(rig, limit=100)
        await rig.tick(3)  # the reply task adopts it; the track pulls its first frame
        assert played(rig) >= 1
        assert llm.asked == [PARIS]  # one stream: the early one went on
        trace = rig.conversation.replies.trace  # the reply's (response.timings)
        assert trace is not None
        timings = trace.as_dict()
        assert timings["early_reply"] is True
        # its first token and its first sentence's speech came before the endpoint
        assert timings["llm_first_token_ms"] == 0.0 and timings["first_tts_ms"] == 0.0
        await rig.tick(120)  # both sentences (1 s each) play out
        assert llm.spoken == ["Once upon a time.", "The end."] and llm.closed == 1
        history = rig.conversation.session.history.turns
        said = [(turn.role, turn.text) for turn in history]
        assert said == [(Role.USER, PARIS), (Role.ASSISTANT, "Once upon a time. The end.")]
        assert outcomes(rig) == (1, 0)
    finally:
        await rig.conversation.close()


async def test_the_user_speaking_on_drops_the_early_reply_unheard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, llm = early_rig(monkeypatch)
    try:
        await speak(rig, 40)
        await pause(rig)
        assert llm.asked == [PARIS]
        rig.voice.on = True  # "... next summer"
        await rig.tick(2)
        assert rig.conversation.replies.early is None and llm.closed == 1  # the LLM aborted
        await rig.tick(20)
        rig.voice.on = False
        await quiet_until_the_turn_ends(rig, limit=100)
        await rig.tick(120)
        # the second pause began a second early reply, which the turn's end adopted
        assert llm.asked == [PARIS, PARIS] and llm.closed == 2
        assert llm.spoken == ["Once upon a time.", "Once upon a time.", "The end."]
        history = rig.conversation.session.history.turns
        assert [turn.role for turn in history] == [Role.USER, Role.ASSISTANT]
        assert outcomes(rig) == (1, 1)
    finally:
        await rig.conversation.close()


@pytest.mark.parametrize("why", ["other words", "shed"])
async def test_an_early_reply_not_adopted_is_closed_before_the_turns_own(
    monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    rig, llm = early_rig(monkeypatch)
    try:
        await speak(rig, 40)
        await pause(rig)
        early = rig.conversation.replies.early
        assert early is not None
        if why == "other words":  # as if it had answered them
            early.request = replace(early.request, context=early.request.context[:-1])
        else:  # as the pipeline sheds it for another session's reply (test_voice.py)
            early.standing.shed = True
        await quiet_until_the_turn_ends(rig, limit=100)
        await rig.tick(5)
        # the session's LLM slot runs one request at a time: the early one ends first
        assert llm.streams[:3] == ["open", "closed", "open"] and played(rig) >= 1
        assert llm.asked == [PARIS, PARIS]
    finally:
        await rig.conversation.close()


async def test_typed_text_drops_the_early_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    rig, llm = early_rig(monkeypatch)
    try:
        await speak(rig, 40)
        await pause(rig)
        await rig.conversation.typed_text("Tell me a story.")
        await rig.tick(5)
        assert llm.asked == [PARIS, "Tell me a story."]  # the typed text's own reply
        assert llm.closed >= 1 and played(rig) >= 1
    finally:
        await rig.conversation.close()


@pytest.mark.parametrize(
    ("partial", "settings"),
    [
        ("I would like to go to", {}),  # the words stop mid-sentence: the user goes on
        (PARIS, {"pipeline.early_reply": "false"}),
    ],
)
async def test_no_early_reply_where_the_words_or_the_settings_say_so(
    monkeypatch: pytest.MonkeyPatch, partial: str, settings: dict[str, str]
) -> None:
    rig, llm = early_rig(monkeypatch, partial, settings=settings)
    try:
        await speak(rig, 40)
        await pause(rig)
        assert llm.asked == [] and llm.warmed[-1] == partial  # warmed as before
    finally:
        await rig.conversation.close()


async def test_no_early_reply_where_the_end_of_turn_model_calls_the_pause_complete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the turn ends on the pause's words at once: an early reply would gain nothing, and
    # would keep other sessions' optional work waiting
    rig, llm = early_rig(monkeypatch, probability=0.9)
    try:
        await speak(rig, 40)
        await quiet_until_the_turn_ends(rig, limit=100)
        await rig.tick(5)
        assert llm.asked == [PARIS] and played(rig) >= 1  # the turn's own reply
        assert outcomes(rig) == (0, 0)
    finally:
        await rig.conversation.close()


async def test_words_that_hold_the_turn_whatever_the_model_hears_begin_it_unheard_by_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the recogniser weighed "the" in place of "Paris": the turn waits the long silence
    # whatever the end-of-turn model would say, so it is not asked, and the reply begins
    rig, llm = early_rig(monkeypatch, probability=0.9)
    llm.rivals = (("the", 0.1),)
    try:
        await speak(rig, 40)
        await pause(rig)
        assert rig.conversation.session.state is TurnState.USER_SPEAKING
        assert llm.asked == [PARIS] and llm.spoken == ["Once upon a time."]
        assert not rig.conversation.floor.turn_probabilities  # the model never heard it
    finally:
        await rig.conversation.close()


async def test_closing_the_conversation_ends_the_early_replys_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig, llm = early_rig(monkeypatch)
    await speak(rig, 40)
    await pause(rig)
    assert llm.asked == [PARIS] and llm.closed == 0  # begun; its first sentence is spoken
    await rig.conversation.close()
    assert llm.closed == 1 and rig.conversation.replies.early is None
