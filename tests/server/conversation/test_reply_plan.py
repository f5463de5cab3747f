"""The reply's plan as a decider: what happened in, actions out, no asyncio.

``ReplyPlan`` (server/conversation/reply_plan.py) is told what the reply's engine calls returned
(the final transcript, the early reply's preparation, a sentence, the speech queued, a failure)
and returns what to carry out, in order; it reads the session and changes nothing itself. These
tests drive it synchronously with a real Session on a fake clock, carrying out by hand the
actions that change the session (server/conversation/reply.py does it around its awaits).
"""

from __future__ import annotations

from dataclasses import replace

from server.clock import FakeClock
from server.config import load_config
from server.conversation.reply_plan import (
    ASKS,
    AdoptEarly,
    AwaitEarly,
    CloseEarly,
    CommitTurn,
    Compose,
    DeliverText,
    EmitDelta,
    EmitTranscript,
    Finish,
    Flush,
    FollowUp,
    MakeCall,
    NextSentence,
    OpenChunk,
    OpenStream,
    ReplyAction,
    ReplyPlan,
    ServerError,
    Speak,
    StartResponse,
    Transcribe,
    TryAdopt,
    WaitForRoom,
    WarmWhenPlayed,
    reported,
)
from server.pipeline.seams import TurnTrace
from server.runtime.events import ResponseDone, ResponseStatus
from server.runtime.session import Session
from server.runtime.tools import FunctionCall
from server.runtime.turn import TurnState
from server.scheduling.engine_queue import StaleWork

HELLO = "Hello there."
EPOCH = 0  # a new session's
DONE = Finish(EPOCH, ResponseStatus.COMPLETED)
FAILED = Finish(EPOCH, ResponseStatus.FAILED)


class Desk:
    """A session whose user has just ended a spoken turn, and a plan for its reply."""

    def __init__(self, spoken: bool = True) -> None:
        self.config = load_config(overrides={"runtime.fade_ms": "0"})
        self.session = Session("r" * 32, self.config.runtime, FakeClock(1_000.0))
        self.session.speech_started(0.0)
        self.session.speech_stopped(500.0)
        if not spoken:  # typed text: a whole turn at once, committed already
            self.session.commit_user_turn(HELLO, answer=True)
        self.item_id = self.session.user_item_id

    def plan(self, **options: bool) -> ReplyPlan:
        return ReplyPlan(self.session, self.session.epoch, limit_s=5.0, **options)

    def carry_out(self, plan: ReplyPlan, actions: list[ReplyAction]) -> list[ReplyAction]:
        """What the session's own actions tell the plan, carried out until an ask for an
        engine (or the end); every action seen, in order."""
        seen: list[ReplyAction] = []
        pending = list(actions)
        while pending:
            action = pending.pop(0)
            seen.append(action)
            assert not pending or not isinstance(action, ASKS), "an ask is the last action"
            if isinstance(action, CommitTurn):
                turn = self.session.commit_user_turn(action.text, action.answer)
                pending = plan.committed(turn is not None)
            elif isinstance(action, StartResponse):
                pending = plan.started(self.session.start_response(action.epoch, action.output))
            elif isinstance(action, OpenChunk):
                pending = plan.opened(self.session.open_chunk(action.epoch, action.sentence))
            elif isinstance(action, DeliverText):
                self.session.deliver_text(action.chunk)
            elif isinstance(action, Finish):
                self.session.finish_response(action.epoch, action.status)
        return seen


def test_a_spoken_turn_is_transcribed_committed_and_answered_in_speech() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False, incremental=True)
    assert plan.begin(spoken=True) == [Transcribe()]
    actions = desk.carry_out(plan, plan.transcribed(HELLO, answer=True))
    assert actions == [
        EmitTranscript(EPOCH, HELLO, desk.item_id or ""),
        CommitTurn(HELLO, True),
        StartResponse(EPOCH, "audio"),
        Flush(),
        Compose(),
        OpenStream(),
        NextSentence(),
    ]
    actions = desk.carry_out(plan, plan.sentence("Hi!"))
    assert actions[:2] == [OpenChunk(EPOCH, "Hi!"), Flush()]
    delta, speak = actions[2], actions[3]
    assert isinstance(delta, EmitDelta) and delta.chunk.text == "Hi!"
    items = desk.session.items
    assert (delta.response_id, delta.item_id) == (items.reply_response_id, items.reply_item_id)
    assert speak == Speak(delta.chunk, from_early=False)
    assert plan.spoken(True) == [WaitForRoom(), NextSentence()]
    assert plan.sentence(None) == [DONE, WarmWhenPlayed(EPOCH)]  # the stream ended


def test_an_empty_transcript_is_no_turn() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False)
    actions = desk.carry_out(plan, plan.transcribed("", answer=True))
    assert actions == [EmitTranscript(EPOCH, "", desk.item_id or ""), CommitTurn("", True), Flush()]
    assert desk.session.state is TurnState.LISTENING


def test_with_create_response_off_the_turn_is_committed_unanswered() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False)
    actions = desk.carry_out(plan, plan.transcribed(HELLO, answer=False))
    assert actions[-2:] == [CommitTurn(HELLO, False), Flush()]
    assert desk.session.state is TurnState.LISTENING


def test_a_transcript_of_a_stale_epoch_ends_the_reply_unheard() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False)
    desk.session.cancel_response()  # an interruption moved the epoch on while it transcribed
    assert desk.session.epoch != plan.epoch
    assert plan.transcribed(HELLO, answer=True) == []


def test_a_response_that_cannot_start_ends_the_reply() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False)
    assert plan.started(False) == []


def test_a_text_reply_commits_each_chunk_as_it_is_sent() -> None:
    desk = Desk(spoken=False)
    plan = desk.plan(text_only=True, incremental=True, early=True)
    actions = desk.carry_out(plan, plan.begin(spoken=False))
    # an early reply never answers a text reply: it is closed before the reply's own stream
    assert actions == [
        StartResponse(EPOCH, "text"),
        Flush(),
        Compose(),
        CloseEarly(),
        OpenStream(),
        NextSentence(),
    ]
    actions = desk.carry_out(plan, plan.sentence(HELLO))
    assert [type(a) for a in actions] == [OpenChunk, Flush, EmitDelta, DeliverText, NextSentence]
    assert plan.sentence(None) == [DONE, WarmWhenPlayed(EPOCH)]


def test_a_chunk_gone_stale_finishes_the_reply() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False)
    desk.carry_out(plan, plan.transcribed(HELLO, answer=True))
    assert plan.opened(None) == [DONE]  # no window warm-up without incremental prefill
    desk.carry_out(plan, plan.sentence(HELLO))
    assert plan.spoken(False) == [DONE]


def test_a_failure_of_each_kind() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False)
    assert plan.failed(StaleWork("barge-in")) == []  # the epoch ended while its job waited
    timeout = ServerError("engine_timeout", "an engine took over 5 s; reply stopped")
    assert plan.failed(TimeoutError()) == [timeout, FAILED]
    # the engine's own words stay in the log
    error = ServerError("engine_error", "the reply failed (ValueError); the server logged why")
    assert plan.failed(ValueError("exceeds 2048 at 10.0.0.7")) == [error, FAILED]


def test_without_a_pipeline_a_spoken_turn_is_heard_and_a_reply_fails() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False)
    actions = desk.carry_out(plan, plan.without_pipeline(spoken=True))
    assert actions == [CommitTurn("", True), Flush()]
    plan = desk.plan(text_only=False)
    no_pipeline = ServerError("no_pipeline", "this server has no reply pipeline")
    assert plan.without_pipeline(spoken=False) == [FAILED, no_pipeline, Flush()]


def test_an_early_reply_that_answers_is_adopted_and_its_first_speech_played() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False, early=True)
    actions = desk.carry_out(plan, plan.transcribed(HELLO, answer=True))
    assert actions[-1] == TryAdopt()
    assert plan.answers(True) == [AwaitEarly()]
    voice = desk.session.conditions
    assert plan.prepared(usable=True, ready=True, voice=voice) == [AdoptEarly(), NextSentence()]
    actions = desk.carry_out(plan, plan.sentence(HELLO))
    first = actions[-1]
    assert isinstance(first, Speak) and first.from_early  # its speech is made already
    assert plan.spoken(True) == [WaitForRoom(), NextSentence()]
    actions = desk.carry_out(plan, plan.sentence("And more."))
    assert actions[-1] == Speak(actions[-1].chunk, from_early=False)  # type: ignore[union-attr]


def test_an_early_reply_spoken_in_other_conditions_is_spoken_again() -> None:
    desk = Desk()
    plan = desk.plan(text_only=False, early=True)
    desk.carry_out(plan, plan.transcribed(HELLO, answer=True))
    plan.answers(True)
    # the session's conditions changed since the early reply spoke (at the chunk's boundary)
    voice = replace(desk.session.conditions, persona="someone else")
    assert plan.prepared(usable=True, ready=True, voice=voice) == [AdoptEarly(), NextSentence()]
    actions = desk.carry_out(plan, plan.sentence(HELLO))
    speak = actions[-1]
    assert isinstance(speak, Speak) and not speak.from_early


def test_an_early_reply_not_adopted_is_closed_before_the_reply_own_stream() -> None:
    own = [CloseEarly(), OpenStream(), NextSentence()]
    desk = Desk()
    plan = desk.plan(text_only=False, early=True)
    desk.carry_out(plan, plan.transcribed(HELLO, answer=True))
    assert plan.answers(False) == own  # it asks otherwise (other words, another window)
    plan = Desk().plan(text_only=False, early=True)
    assert plan.prepared(usable=False, ready=True, voice=desk.session.conditions) == own
    # a reply with its own instructions: the early reply (on the persona) never answers it
    desk = Desk()
    plan = desk.plan(text_only=False, early=True, instructions=True)
    actions = desk.carry_out(plan, plan.transcribed(HELLO, answer=True))
    assert actions[-3:] == own


def test_timings_are_reported_for_a_reply_that_was_heard() -> None:
    done = ResponseDone(1, ResponseStatus.COMPLETED)
    assert reported(done, None) is None
    assert reported(done, TurnTrace(endpoint_ms=1.0)) is None  # nothing of it played
    trace = TurnTrace(endpoint_ms=1.0, asr_final_ms=11.0, first_audio_ms=101.0)
    report = reported(done, trace)
    assert report is not None
    assert (report.epoch, report.status) == (1, "completed")
    assert report.timings == trace.as_dict()


def test_a_call_is_made_and_the_stream_goes_on_and_ends_the_reply() -> None:
    desk = Desk(spoken=False)
    plan = desk.plan(text_only=False)
    desk.carry_out(plan, plan.begin(spoken=False))
    call = FunctionCall("call_1", "get_time", "{}")
    assert plan.sentence(call) == [MakeCall(EPOCH, call)]
    assert desk.session.record_call(EPOCH, call)
    assert plan.called(True) == [Flush(), NextSentence()]
    assert plan.sentence(None) == [DONE]  # the client's output leads on: no follow-up


def test_a_stale_call_ends_the_reply() -> None:
    desk = Desk(spoken=False)
    plan = desk.plan(text_only=False)
    desk.carry_out(plan, plan.begin(spoken=False))
    assert plan.called(False) == [DONE]


def test_the_avatars_own_tools_alone_are_followed_by_a_reply_that_talks() -> None:
    desk = Desk(spoken=False)
    plan = desk.plan(text_only=False)
    desk.carry_out(plan, plan.begin(spoken=False))
    assert plan.called(True, own=True) == [Flush(), NextSentence()]
    assert plan.sentence(None) == [FollowUp(EPOCH), DONE]
    words = desk.plan(text_only=False)  # own tools, then words: nothing follows
    words.called(True, own=True)
    desk.carry_out(words, words.sentence("Sure!"))
    assert words.sentence(None) == [DONE]
    both = desk.plan(text_only=False)  # own tools and a client's call: the client leads on
    both.called(True, own=True)
    both.called(True)
    assert both.sentence(None) == [DONE]
