"""Tools, tool choice and call items in client events (server/wire/realtime_tools.py), in both
dialects: parsed whole, or refused with an error naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from server.runtime.tools import ChoiceMode, ToolChoice
from server.wire.protocol import ProtocolError, TextInput
from server.wire.realtime_client import (
    ResponseCreate,
    parse_native_event,
    parse_realtime_event,
)
from server.wire.realtime_tools import CallCreate, CallOutputCreate, ToolsUpdate

LAMP = {
    "type": "function",
    "name": "set_lamp",
    "description": "Set the lamp.",
    "parameters": {"type": "object", "properties": {"color": {"type": "string"}}},
}


def raw(event: dict[str, Any]) -> str:
    return json.dumps(event)


def test_a_response_may_name_its_own_tools_and_choice() -> None:
    event = parse_realtime_event(
        raw({"type": "response.create", "response": {"tools": [LAMP], "tool_choice": "required"}}),
        64_000,
    )
    assert isinstance(event, ResponseCreate)
    assert event.tools is not None and event.tools[0].name == "set_lamp"
    assert event.tool_choice == ToolChoice(ChoiceMode.REQUIRED)


def test_call_items_are_parsed_and_checked() -> None:
    output = {"type": "function_call_output", "call_id": "call_1", "output": "ok", "id": "i1"}
    event = parse_realtime_event(raw({"type": "conversation.item.create", "item": output}), 64_000)
    assert event == CallOutputCreate("call_1", "ok", "i1")
    call = {"type": "function_call", "call_id": "c", "name": "set_lamp", "arguments": "{}"}
    made = parse_realtime_event(raw({"type": "conversation.item.create", "item": call}), 64_000)
    assert isinstance(made, CallCreate) and made.call.name == "set_lamp"
    for item, param in (
        ({"type": "function_call_output", "output": "ok"}, "item.call_id"),
        ({"type": "function_call_output", "call_id": "c", "output": 5}, "item.output"),
        ({"type": "function_call_output", "call_id": "c", "output": "x" * 4001}, "item.output"),
        ({"type": "function_call", "call_id": "c", "name": "no such!"}, "item.name"),
        ({"type": "mcp_call", "call_id": "c"}, "item.type"),
    ):
        with pytest.raises(ProtocolError) as refused:
            parse_realtime_event(raw({"type": "conversation.item.create", "item": item}), 64_000)
        assert refused.value.param == param, item


def test_the_native_dialect_sets_tools_and_answers_an_output_by_itself() -> None:
    update = parse_native_event(
        raw({"type": "session.update", "session": {"tools": [LAMP], "voice": "joe"}}), 64_000
    )
    assert isinstance(update, ToolsUpdate)
    assert update.tools is not None and update.changes == {"voice": "joe"}
    output = {"type": "function_call_output", "call_id": "c", "output": "done"}
    answered = parse_native_event(raw({"type": "conversation.item.create", "item": output}), 64_000)
    assert isinstance(answered, CallOutputCreate) and answered.answer
    typed = parse_native_event(raw({"type": "conversation.item.create", "text": "hi"}), 64_000)
    assert typed == TextInput("hi")
    with pytest.raises(ProtocolError):
        parse_native_event(
            raw({"type": "session.update", "session": {"tool_choice": "maybe"}}), 64_000
        )
