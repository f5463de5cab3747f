"""The avatar's built-in tools: their schemas, and calls carried out on gestures and a session."""

from __future__ import annotations

import json

import pytest
from jsonschema import validators

from server.avatar.builtin_tools import (
    BUILTIN_NAMES,
    EXPRESSION_MS,
    LOOK_MS,
    builtin_tools,
    is_builtin,
    run_builtin,
)
from server.avatar.gestures import AT_USER, NO_CUE, Gestures
from server.avatar.seam import Expression
from server.clock import FakeClock
from server.config import RuntimeConfig
from server.runtime.session import Session
from server.runtime.tools import FunctionCall, ToolSettings

LOOKS = ("ada", "milo")


def _call(name: str, arguments: object = None) -> FunctionCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return FunctionCall("call_1", name, text)


def _session(clock: FakeClock) -> Session:
    choices = {"appearance": (*LOOKS, "default")}
    return Session("b" * 16, RuntimeConfig(appearance="ada"), clock, choices=choices)


def test_three_tools_with_valid_closed_schemas() -> None:
    tools = builtin_tools(LOOKS)
    assert [t.name for t in tools] == ["show_expression", "set_appearance", "look_at_user"]
    assert {t.name for t in tools} == BUILTIN_NAMES
    for tool in tools:
        assert len(tool.description) > 40
        validators.validator_for(tool.parameters).check_schema(tool.parameters)
        assert tool.parameters["additionalProperties"] is False
        assert tool.as_chat()["function"]["name"] == tool.name
    settings = ToolSettings(tools)
    expression = settings.named("show_expression")
    appearance = settings.named("set_appearance")
    look = settings.named("look_at_user")
    assert expression is not None and appearance is not None and look is not None
    assert expression.parameters["properties"]["expression"]["enum"] == [
        "smile",
        "surprise",
        "thinking",
    ]
    assert appearance.parameters["properties"]["appearance"]["enum"] == list(LOOKS)
    assert look.parameters["properties"] == {}
    assert is_builtin("look_at_user") and not is_builtin("get_weather")


def test_without_looks_there_is_no_set_appearance() -> None:
    assert [t.name for t in builtin_tools(())] == ["show_expression", "look_at_user"]


def test_another_tool_is_not_a_builtin() -> None:
    gestures = Gestures(FakeClock())
    assert run_builtin(_call("get_weather", {"city": "Oslo"}), gestures, _no_update) is None
    assert gestures.now() == NO_CUE


def _no_update(changes: dict[str, object]) -> None:
    raise AssertionError(f"no update expected: {changes}")


@pytest.mark.parametrize(
    ("word", "expression"),
    [
        ("smile", Expression.SMILING),
        ("surprise", Expression.SURPRISED),
        ("thinking", Expression.THINKING),
    ],
)
def test_show_expression_shows_it_for_a_while(word: str, expression: Expression) -> None:
    clock = FakeClock()
    gestures = Gestures(clock)
    out = run_builtin(_call("show_expression", {"expression": word}), gestures, _no_update)
    assert out is not None and json.loads(out) == {"ok": True, "expression": word}
    assert gestures.now().expression is expression
    clock.advance(EXPRESSION_MS - 1)
    assert gestures.now().expression is expression
    clock.advance(1)
    assert gestures.now() == NO_CUE


def test_look_at_user_looks_for_a_while() -> None:
    clock = FakeClock()
    gestures = Gestures(clock)
    for arguments in ("{}", "", "  "):  # no arguments: an empty object or nothing
        out = run_builtin(_call("look_at_user", arguments), gestures, _no_update)
        assert out is not None and json.loads(out) == {"ok": True, "looking_at_user": True}
    assert gestures.now().gaze == AT_USER and gestures.now().expression is None
    clock.advance(LOOK_MS)
    assert gestures.now() == NO_CUE


def test_set_appearance_changes_the_look_at_the_next_boundary() -> None:
    clock = FakeClock()
    session = _session(clock)
    gestures = Gestures(clock)
    session.submit_text("hi")
    assert session.start_response(session.epoch)
    assert session.open_chunk(session.epoch, "One.") is not None  # mid-reply
    call = _call("set_appearance", {"appearance": "milo"})
    out = run_builtin(call, gestures, session.request_update)
    assert out is not None and json.loads(out) == {"ok": True, "appearance": "milo"}
    assert session.conditions.appearance == "ada"  # waits for the chunk boundary
    assert gestures.now() == NO_CUE


def test_set_appearance_applies_at_once_between_replies() -> None:
    session = _session(FakeClock())
    call = _call("set_appearance", {"appearance": "milo"})
    out = run_builtin(call, Gestures(FakeClock()), session.request_update)
    assert out is not None and json.loads(out)["ok"] is True
    assert session.conditions.appearance == "milo"


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("show_expression", "{not json", "not JSON"),
        ("show_expression", "[1, 2]", "JSON object"),
        ("show_expression", {}, "'expression' is a required property"),
        ("show_expression", {"expression": "grin"}, "'grin' is not one of"),
        ("show_expression", {"expression": 3}, "expression: 3 is not of type 'string'"),
        ("show_expression", {"expression": "smile", "for": 9}, "Additional properties"),
        ("look_at_user", {"at": "me"}, "Additional properties"),
        ("set_appearance", {}, "'appearance' is a required property"),
        ("set_appearance", {"appearance": ""}, "should be non-empty"),
    ],
)
def test_bad_arguments_give_an_error_output_and_do_nothing(
    name: str, arguments: object, says: str
) -> None:
    gestures = Gestures(FakeClock())
    out = run_builtin(_call(name, arguments), gestures, _no_update)
    assert out is not None
    result = json.loads(out)
    assert result["ok"] is False and says in result["error"] and name in result["error"]
    assert gestures.now() == NO_CUE and gestures.shown == 0


def test_an_unknown_appearance_is_an_error_output() -> None:
    session = _session(FakeClock())
    call = _call("set_appearance", {"appearance": "zed"})
    out = run_builtin(call, Gestures(FakeClock()), session.request_update)
    assert out is not None
    result = json.loads(out)
    assert result["ok"] is False and "unknown appearance 'zed'" in result["error"]
    assert "ada, milo" in result["error"]
    assert session.conditions.appearance == "ada"


def test_a_huge_bad_value_gives_a_short_error() -> None:
    call = _call("show_expression", {"expression": "x" * 10_000})
    out = run_builtin(call, Gestures(FakeClock()), _no_update)
    assert out is not None and len(out) < 500
