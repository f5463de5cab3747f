"""The floor as a decider: detector events and verdicts in, actions out, no asyncio.

The floor reads the session and the detector and returns what the conversation is to do
(server/conversation/turn_actions.py); it changes no session state itself. These tests call it
synchronously with a real Session and TurnDetector on a fake clock (the gate and confirming
model scripted, as in tests/server/conversation/test_interjection.py) and carry the actions out
by hand where a later step needs their effect.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt

from server.clock import FakeClock
from server.config import load_config
from server.conversation.floor import Floor
from server.conversation.hearing import HEARINGS
from server.conversation.interjection import Decision, Verdict
from server.conversation.partials import Partials
from server.conversation.turn_actions import (
    EndTurn,
    HearUtterance,
    PauseReply,
    ResumeReply,
    TakeFloor,
)
from server.conversation.utterance import Utterance
from server.metrics import Metrics
from server.pipeline.seams import ReplyRequest
from server.pipeline.turn_detector import (
    TurnCompleteness,
    TurnDetector,
    VadEvent,
    VadEventKind,
    VadState,
)
from server.runtime.session import Session
from server.runtime.turn import TurnState
from server.wire.realtime_session import TurnSettings
from tests.server.conversation.test_interjection import Voice

FRAME_16K = 320  # samples of one 20 ms frame at 16 kHz


class Desk:
    """A floor with the session, detector and partials it reads (``settings``: dotted)."""

    def __init__(
        self,
        settings: dict[str, str] | None = None,
        incremental: bool = False,
        completeness: TurnCompleteness | None = None,
    ) -> None:
        self.config = load_config(overrides={"runtime.fade_ms": "0", **(settings or {})})
        self.clock = FakeClock(1_000.0)
        self.voice = Voice()
        self.detector = TurnDetector(self.voice, self.voice, self.config.vad, completeness)
        self.session = Session("f" * 32, self.config.runtime, self.clock)
        self.utterance = Utterance()
        metrics = Metrics()
        self.partials = Partials(
            self.session,
            self.detector,
            self.utterance,
            metrics,
            self.clock,
            self.config.pipeline.partial_interval_ms,
            lambda event: None,
            self._request,
        )
        self.turn = TurnSettings.from_config(self.config)
        self.floor = Floor(
            self.session,
            self.detector,
            self.utterance,
            self.partials,
            self.config,
            metrics,
            self.clock,
            lambda: self.turn,
            incremental,
        )

    def _request(self, epoch: int) -> ReplyRequest:
        raise AssertionError("the floor asks the engines nothing")

    def frames(self, count: int, voice: bool) -> list[VadEvent]:
        """``count`` frames of 20 ms through the detector, voiced or not; its events."""
        self.voice.on = voice
        pcm = np.full(FRAME_16K, 3000 if voice else 0, np.int16)
        events: list[VadEvent] = []
        for _ in range(count):
            self.clock.advance(20.0)
            events += self.detector.push(pcm, self.clock.now_ms(), pcm)
        return events

    def replying(self) -> None:
        """A reply is on (typed text: the turn is THINKING)."""
        self.session.submit_text("Tell me a story.")
        assert self.session.state is TurnState.THINKING


def onset(at_ms: float = 500.0, arrival_ms: float = 1_500.0) -> VadEvent:
    return VadEvent(VadEventKind.ONSET, at_ms, arrival_ms)


def start(at_ms: float = 500.0) -> VadEvent:
    return VadEvent(VadEventKind.START, at_ms, 1_500.0, 1_560.0)


def test_speech_while_listening_takes_the_floor_and_a_pause_ends_the_turn() -> None:
    desk = Desk()
    actions = desk.floor.on_vad(start(500.0))
    assert actions == [TakeFloor(500.0, 1_500.0, 1_560.0, 0.0, True, False, False)]
    assert desk.session.state is TurnState.LISTENING  # decided, not done
    desk.session.speech_started(500.0)  # what the conversation does with TakeFloor
    assert desk.floor.on_vad(VadEvent(VadEventKind.STOP, 1_200.0, 0.0)) == [EndTurn(1_200.0)]


def test_a_turn_with_partials_starts_them_once() -> None:
    desk = Desk(incremental=True)
    first = desk.floor.on_vad(start(100.0))
    assert first == [TakeFloor(100.0, 1_500.0, 1_560.0, 0.0, True, True, False)]
    desk.session.speech_started(100.0)
    again = desk.floor.on_vad(start(900.0))  # the turn goes on: its audio and loop stay
    assert again == [TakeFloor(900.0, 1_500.0, 1_560.0, 0.0, False, False, False)]
    desk.floor.end_turn(1_500.0)
    assert not desk.floor.partials_on


def test_voice_over_a_reply_pauses_it_and_changes_nothing_itself() -> None:
    desk = Desk()
    desk.replying()
    epoch = desk.session.epoch
    assert desk.floor.on_vad(onset(700.0, 1_234.0)) == [PauseReply(1_234.0)]
    assert desk.session.state is TurnState.THINKING and desk.session.epoch == epoch
    assert desk.floor.judge.onset_ms == 700.0  # the judge hears it from its onset


def test_without_pause_first_confirmed_speech_over_a_reply_is_the_one_interruption() -> None:
    desk = Desk({"vad.pause_first": "false"})
    desk.replying()
    assert desk.floor.on_vad(onset()) == []  # nothing pauses
    actions = desk.floor.on_vad(start(800.0))
    assert actions == [TakeFloor(800.0, 1_500.0, 1_560.0, 0.0, True, False, False)]
    epoch = desk.session.epoch
    barge = desk.session.speech_started(800.0)  # the session bumps the epoch, once
    assert barge is not None and desk.session.epoch == epoch + 1


def test_speech_over_a_reply_is_not_heard_with_interrupt_response_off() -> None:
    desk = Desk()
    desk.turn = replace(desk.turn, interrupt_response=False)
    desk.replying()
    assert desk.floor.on_vad(onset()) == []
    assert desk.floor.on_vad(start()) == []


def test_a_paused_reply_resumes_or_the_user_takes_the_floor() -> None:
    desk = Desk()
    desk.replying()
    desk.frames(10, voice=False)
    assert desk.floor.on_vad(onset(desk.detector.position_ms, 1_000.0)) == [PauseReply(1_000.0)]
    assert desk.session.pause_reply()  # carried out
    assert desk.floor.decide(Decision(Verdict.RESUME, "a cough")) == [ResumeReply("a cough")]
    assert desk.floor.resumed == 1

    desk.session.resume_reply("a cough")
    onset_ms = desk.detector.position_ms
    desk.floor.on_vad(onset(onset_ms, 2_000.0))
    desk.session.pause_reply()
    desk.frames(5, voice=False)  # the voice already ended: the turn ends with the floor taken
    actions = desk.floor.decide(Decision(Verdict.INTERRUPT, "stop"))
    assert desk.detector.state is VadState.SILENCE
    back_ms = desk.detector.position_ms - onset_ms
    assert actions == [
        TakeFloor(onset_ms, None, None, back_ms, True, False, False),
        EndTurn(desk.detector.position_ms),
    ]
    assert desk.floor.interrupted == 1


def test_a_pause_past_its_deadline_without_confirmed_speech_resumes() -> None:
    desk = Desk()
    desk.replying()
    desk.floor.on_vad(onset())
    desk.session.pause_reply()
    assert desk.floor.overdue() == [ResumeReply("undecided")]


def test_after_frames_over_nothing_paused_decides_nothing() -> None:
    desk = Desk()
    desk.replying()
    assert desk.floor.after_frames() == []


class Model:
    """An end-of-turn model that is never run here: the floor only asks for a hearing."""

    def probability(self, audio: npt.NDArray[np.int16]) -> float:
        raise AssertionError("the conversation runs the model, not the floor")


def test_a_semantic_pause_asks_for_a_hearing_and_an_old_verdict_does_not_count() -> None:
    desk = Desk(completeness=Model())
    desk.frames(20, voice=True)
    desk.session.speech_started(0.0)
    asked: list[HearUtterance] = []
    for _ in range(40):  # quiet, 20 ms at a time, until the first hearing is due
        desk.frames(1, voice=False)
        asked += [a for a in desk.floor.after_frames() if isinstance(a, HearUtterance)]
        if asked:
            break
    assert asked and asked[0].hearing == HEARINGS[0]
    assert desk.floor.after_frames() == []  # one hearing at a time
    desk.frames(1, voice=True)  # the user speaks on: that hearing's verdict will not count
    desk.floor.after_frames()
    desk.floor.heard_probability(asked[0], 0.99)
    assert not desk.floor.turn_probabilities


def test_a_client_that_stops_the_paused_reply_hands_confirmed_speech_the_floor() -> None:
    desk = Desk()
    desk.replying()
    assert desk.floor.client_stopped() == []  # nothing paused
    desk.frames(5, voice=False)
    onset_ms = desk.detector.position_ms
    desk.floor.on_vad(onset(onset_ms))
    desk.session.pause_reply()
    assert desk.floor.client_stopped() == []  # no speech yet: the detector's start begins it
    desk.frames(10, voice=True)  # confirmed speech
    assert desk.detector.state is VadState.SPEECH
    back_ms = desk.detector.position_ms - onset_ms
    assert desk.floor.client_stopped() == [TakeFloor(onset_ms, None, None, back_ms)]
    assert desk.floor.interrupted == 1
