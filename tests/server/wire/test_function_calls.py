"""Function calling on the ``oai-events`` dialect inside one conversation: ``session.tools``
and ``tool_choice``, a reply that calls a function (its GA events, each validated by the
``openai`` package's models), the client's ``function_call_output`` and the reply spoken from
it, and the runtime's rules for calls: the epoch fence, a barge-in cancels a waiting call (its
late output is kept but answers nothing), history in order, an output that never comes.

The LLM stage is a scripted stand-in (tests/support/tone_pipeline.py ``CallingTonePipeline``):
these tests are about the conversation and the wire; the real model's calls are tested in
tests/models/test_tool_calls.py and end to end in tests/models/test_tools_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from server.avatar.seam import Expression
from server.clock import FakeClock
from server.config import load_config
from server.conversation.conversation import CALL_APOLOGY, REALTIME_DIALECT, Conversation
from server.metrics import Metrics
from server.pipeline.turn_detector import TurnDetector
from server.runtime.calls import CallState
from server.runtime.history import Role
from server.runtime.tools import ChoiceMode, FunctionCall
from tests.server.wire.test_realtime_dialect import Gate, Link, Quiet, send, until, validate
from tests.support.tone_pipeline import CallingTonePipeline

LAMP = {
    "type": "function",
    "name": "set_lamp",
    "description": "Set the colour of the lamp in the room.",
    "parameters": {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
}
CLOCK = {"type": "function", "name": "get_time", "description": "The time now."}


def open_calling(
    pipeline: CallingTonePipeline,
    clock: FakeClock | None = None,
    settings: dict[str, str] | None = None,
    dialect: str = REALTIME_DIALECT,
) -> tuple[Conversation, Link]:
    """A started conversation on a link whose channel speaks ``dialect``; close it."""
    config = load_config(overrides={"pipeline.incremental": "false", **(settings or {})})
    detector = TurnDetector(Gate(), Quiet(), config.vad)
    conversation = Conversation("c" * 32, config, detector, pipeline, Metrics(), clock=clock)
    link = Link()
    conversation.attach(link)
    conversation.start()
    conversation.link_open(audio=True, video=False, resumed=None, dialect=dialect)
    return conversation, link


@pytest.fixture
async def calling() -> AsyncIterator[tuple[Conversation, Link, CallingTonePipeline]]:
    pipeline = CallingTonePipeline(200.0, 1, arguments='{"color": "red"}')
    conversation, link = open_calling(pipeline)
    yield conversation, link, pipeline
    await conversation.close()


def ask(conversation: Conversation, text: str, **response: Any) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    send(conversation, {"type": "conversation.item.create", "item": item})
    send(conversation, {"type": "response.create", "response": response})


def answer(conversation: Conversation, call_id: str, output: str) -> None:
    item = {"type": "function_call_output", "call_id": call_id, "output": output}
    send(conversation, {"type": "conversation.item.create", "item": item})
    send(conversation, {"type": "response.create"})


async def with_tools(conversation: Conversation, link: Link, *tools: dict[str, Any]) -> None:
    send(conversation, {"type": "session.update", "session": {"tools": list(tools)}})
    await until(link, "session.updated")


async def test_session_tools_are_set_shown_and_checked(
    calling: tuple[Conversation, Link, CallingTonePipeline],
) -> None:
    conversation, link, _ = calling
    choice = {"type": "function", "name": "set_lamp"}
    send(conversation, {"type": "session.update", "session": {"tools": [LAMP, CLOCK]}})
    send(conversation, {"type": "session.update", "session": {"tool_choice": choice}})
    await until(link, "session.updated")
    for _ in range(100):
        if len(link.of("session.updated")) == 2:
            break
        await asyncio.sleep(0.01)
    shown = link.of("session.updated")[-1]["session"]
    assert [t["name"] for t in shown["tools"]] == ["set_lamp", "get_time"]
    assert shown["tools"][1]["parameters"] == {"type": "object", "properties": {}}
    assert shown["tool_choice"] == choice
    assert conversation.tools.choice.mode is ChoiceMode.FUNCTION
    n = len(link.sent)
    bad_schema = {**LAMP, "parameters": {"type": "object", "properties": {"color": {"type": 5}}}}
    for session in (
        {"tools": [LAMP, LAMP]},  # two of one name
        {"tools": [{**LAMP, "name": "set lamp!"}]},
        {"tools": [bad_schema]},
        {"tools": [{"type": "mcp", "server_label": "x", "server_url": "http://x"}]},
        {"tools": [LAMP], "tool_choice": {"type": "function", "name": "get_time"}},
        {"tool_choice": "sometimes"},
    ):
        send(conversation, {"type": "session.update", "session": session})
    for _ in range(100):
        if len(link.of("error", n)) == 6:
            break
        await asyncio.sleep(0.01)
    codes = [e["error"]["code"] for e in link.of("error", n)]
    assert codes == ["invalid_value"] * 3 + ["unsupported_feature"] + ["invalid_value"] * 2
    assert [t.name for t in conversation.tools.tools] == ["set_lamp", "get_time"]  # unchanged
    validate(link.sent)


async def test_a_call_its_output_and_the_answer_in_ga_events(
    calling: tuple[Conversation, Link, CallingTonePipeline],
) -> None:
    conversation, link, pipeline = calling
    await with_tools(conversation, link, LAMP)
    n = len(link.sent)
    ask(conversation, "Make the lamp red, please.")
    done = await until(link, "response.done", n, conversation)
    kinds = [e["type"] for e in link.sent[n:]]
    call_events = [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
    ]
    at = kinds.index("response.output_item.added")
    assert kinds[at : at + 6] == call_events
    args = link.of("response.function_call_arguments.done", n)[0]
    assert (args["name"], json.loads(args["arguments"])) == ("set_lamp", {"color": "red"})
    assert done["response"]["status"] == "completed"
    [item] = done["response"]["output"]
    assert item["type"] == "function_call" and item["call_id"] == args["call_id"]
    assert item["arguments"] == args["arguments"] and item["status"] == "completed"
    assert not link.of("response.output_audio.delta", n)  # a call alone says nothing
    assert conversation.session.calls.state(args["call_id"]) is CallState.WAITING
    assert pipeline.requests[-1].tools.tools[0].name == "set_lamp"

    m = len(link.sent)
    answer(conversation, args["call_id"], '{"lamp": "red"}')
    spoken = await until(link, "response.done", m, conversation)
    added = link.of("conversation.item.added", m)[0]["item"]
    assert added["type"] == "function_call_output" and added["output"] == '{"lamp": "red"}'
    assert added["call_id"] == args["call_id"]
    [message] = spoken["response"]["output"]
    assert message["type"] == "message"
    assert message["content"][0]["transcript"] == 'The tool said {"lamp": "red"}.'
    assert conversation.session.calls.state(args["call_id"]) is CallState.ANSWERED
    turns = conversation.session.history.turns
    assert [(t.role, t.call is not None, bool(t.call_id)) for t in turns] == [
        (Role.USER, False, False),
        (Role.ASSISTANT, True, False),
        (Role.TOOL, False, True),
        (Role.ASSISTANT, False, False),
    ]
    context = pipeline.requests[-1].context
    assert context[-1].call_id == args["call_id"] and context[-2].call is not None
    _, types = validate(link.sent)
    assert {"response.function_call_arguments.done", "response.output_item.done"} <= types


async def test_words_then_a_call_then_the_answer_after_they_played() -> None:
    """'Let me check.' then the call: the message is output 0, the call output 1; the output
    comes while the words still play, and the answer follows once they have played out;
    history holds the words before the call."""
    pipeline = CallingTonePipeline(600.0, 1, preamble="Let me check.", arguments="{}")
    conversation, link = open_calling(pipeline)
    try:
        await with_tools(conversation, link, CLOCK)
        n = len(link.sent)
        ask(conversation, "What time is it?")
        args = await until(link, "response.function_call_arguments.done", n, conversation)
        assert args["output_index"] == 1
        assert conversation.session.state.value in ("thinking", "agent_speaking")
        m = len(link.sent)
        answer(conversation, args["call_id"], "It is 14:05.")
        first = await until(link, "response.done", n, conversation)
        assert [o["type"] for o in first["response"]["output"]] == ["message", "function_call"]
        assert not link.of("error", m)  # the answer waited for the words, no busy error
        second = await until(link, "response.done", len(link.sent), conversation)
        transcript = second["response"]["output"][0]["content"][0]["transcript"]
        assert transcript == "The tool said It is 14:05.."
        turns = conversation.session.history.turns
        assert [t.text for t in turns[:2]] == ["What time is it?", "Let me check."]
        assert turns[2].call is not None and turns[3].call_id == args["call_id"]
        validate(link.sent)
    finally:
        await conversation.close()


async def test_a_barge_in_cancels_a_waiting_call_and_its_late_output_answers_nothing(
    calling: tuple[Conversation, Link, CallingTonePipeline],
) -> None:
    conversation, link, pipeline = calling
    await with_tools(conversation, link, LAMP)
    ask(conversation, "Lamp to red.")
    args = await until(link, "response.function_call_arguments.done", 0, conversation)
    await until(link, "response.done", 0, conversation)
    typed = len(link.sent)
    await conversation.typed_text("Never mind, leave it.")  # the user moved on
    assert conversation.session.calls.state(args["call_id"]) is CallState.CANCELLED
    await until(link, "response.done", typed, conversation)  # its reply (a call again)
    replies = len(pipeline.requests)
    n = len(link.sent)
    answer(conversation, args["call_id"], "done")
    await until(link, "conversation.item.added", n)
    for _ in range(30):
        conversation.pull_audio(960)
        await asyncio.sleep(0.01)
    assert not link.of("response.created", n)  # kept, but no reply to it
    assert len(pipeline.requests) == replies
    assert conversation.session.history.turns[-1].call_id == args["call_id"]
    validate(link.sent)


async def test_an_output_for_no_call_is_refused_and_changes_nothing(
    calling: tuple[Conversation, Link, CallingTonePipeline],
) -> None:
    conversation, link, _ = calling
    before = conversation.session.history.turns
    item = {"type": "function_call_output", "call_id": "call_nobody_made", "output": "42"}
    send(conversation, {"type": "conversation.item.create", "item": item})
    error = await until(link, "error")
    assert error["error"]["code"] == "invalid_item"
    assert conversation.session.history.turns == before


async def test_an_output_that_never_comes_ends_in_a_spoken_apology() -> None:
    clock = FakeClock(1000.0)
    pipeline = CallingTonePipeline(200.0, 1)
    conversation, link = open_calling(pipeline, clock)
    try:
        await with_tools(conversation, link, CLOCK)
        ask(conversation, "What time is it?")
        args = await until(link, "response.function_call_arguments.done", 0, conversation)
        await until(link, "response.done", 0, conversation)
        n = len(link.sent)
        clock.advance(conversation.config.runtime.tool_output_timeout_ms - 1)
        conversation.enforce_call_deadlines()
        assert not link.of("conversation.item.added", n)
        clock.advance(1)
        conversation.enforce_call_deadlines()
        state = conversation.session.calls.state(args["call_id"])
        assert state is CallState.TIMED_OUT
        added = (await until(link, "conversation.item.added", n))["item"]
        assert added["type"] == "function_call_output" and "error" in added["output"]
        done = await until(link, "response.done", n, conversation)
        assert done["response"]["output"][0]["content"][0]["transcript"] == CALL_APOLOGY
        validate(link.sent)
    finally:
        await conversation.close()


async def test_stale_calls_are_dropped_by_the_epoch_fence(
    calling: tuple[Conversation, Link, CallingTonePipeline],
) -> None:
    conversation, _, _ = calling
    session = conversation.session
    call = FunctionCall("call_old", "set_lamp", "{}")
    assert not session.record_call(session.epoch, call)  # no response in progress
    assert not session.record_call(session.epoch - 1, call)
    assert session.history.call("call_old") is None


async def test_the_avatars_own_tools_run_in_the_server_and_the_reply_goes_on() -> None:
    """``avatar.builtin_tools``: a reply's call of ``show_expression`` is run by the server
    (the face smiles), told as one ``x-avatar.tool`` event, not as a call for the client; the
    next reply reads its output and talks, and may not call it again."""
    pipeline = CallingTonePipeline(200.0, 1, arguments='{"expression": "smile"}')
    conversation, link = open_calling(pipeline, settings={"avatar.builtin_tools": "true"})
    try:
        ask(conversation, "Give me a smile!")
        ran = await until(link, "x-avatar.tool", 0, conversation)
        assert ran["name"] == "show_expression"
        assert json.loads(ran["output"])["ok"] is True
        assert conversation.gestures.now().expression is Expression.SMILING
        offered = [t.name for t in pipeline.requests[0].tools.tools]
        assert offered[0] == "show_expression"  # the only tools here: the avatar's own
        first = await until(link, "response.done", 0, conversation)
        assert first["response"]["output"] == []  # nothing for the client to run
        second = await until(link, "response.done", link.sent.index(first) + 1, conversation)
        transcript = second["response"]["output"][0]["content"][0]["transcript"]
        assert transcript.startswith("The tool said {")
        # offered again (the prompt's head stays cached); the stand-in LLM calls again, but
        # no third reply follows in the same user turn
        assert [t.name for t in pipeline.requests[-1].tools.tools] == offered
        assert not link.of("response.function_call_arguments.done")
        turns = conversation.session.history.turns
        assert [t.role for t in turns] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
        validate(link.sent)
    finally:
        await conversation.close()


async def test_the_native_events_channel_calls_and_answers_an_output_by_itself() -> None:
    pipeline = CallingTonePipeline(200.0, 1, arguments='{"color": "red"}')
    conversation, link = open_calling(pipeline, dialect="native")
    try:
        send(conversation, {"type": "session.update", "session": {"tools": [LAMP]}})
        send(conversation, {"type": "conversation.item.create", "text": "Lamp red, please."})
        made = await until(link, "response.function_call_arguments.done", 0, conversation)
        assert (made["name"], made["arguments"]) == ("set_lamp", '{"color": "red"}')
        first = await until(link, "response.done", 0, conversation)
        item = {"type": "function_call_output", "call_id": made["call_id"], "output": "red now"}
        send(conversation, {"type": "conversation.item.create", "item": item})
        added = await until(link, "conversation.item.created", link.sent.index(first))
        assert added["item_type"] == "function_call_output"
        said = await until(link, "response.audio_transcript.delta", link.sent.index(first))
        assert said["delta"] == "The tool said red now."
    finally:
        await conversation.close()
