"""The function-calling benchmark's tool set and its scoring: no model runs here.

The set (benchmarks/data/tool_set.json) is large enough, both splits hold both kinds of request,
every expected call names a declared tool with arguments its schema takes; the judging of calls
and the scores are checked on outcomes made by hand.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import jsonschema
import pytest

from benchmarks.tools_bench import (
    SPLITS,
    TOOL_SET,
    Call,
    Expect,
    Outcome,
    Request,
    argument_problem,
    judge,
    load_set,
    score,
    tool_result,
)

TOOL_SET_DATA = load_set()


def example_arguments(expect: Expect) -> dict[str, Any]:
    """Arguments that pass the item's check: exact values, and each substring as the text."""
    return {
        key: want["contains"] if isinstance(want, dict) else want
        for key, want in expect.arguments.items()
    }


def test_the_set_is_large_enough_and_both_splits_hold_both_kinds() -> None:
    requests = TOOL_SET_DATA.requests
    tool = [r for r in requests if r.expect is not None]
    free = [r for r in requests if r.expect is None]
    assert len(tool) >= 40 and len(free) >= 20
    assert 4 <= len(TOOL_SET_DATA.tools) <= 6
    assert {r.split for r in requests} == set(SPLITS)
    for part in (tool, free):
        splits = Counter(r.split for r in part)
        assert set(splits) == set(SPLITS)
        assert 0.5 <= splits["tuning"] / len(part) <= 0.7  # about 60 % to tune on
    # every tool is asked for, in both splits
    for name in TOOL_SET_DATA.names():
        asked = {r.split for r in tool if r.expect is not None and r.expect.name == name}
        assert asked == set(SPLITS), name


def test_requests_are_not_repeated() -> None:
    ids = Counter(r.id for r in TOOL_SET_DATA.requests)
    texts = Counter(" ".join(r.text.lower().split()) for r in TOOL_SET_DATA.requests)
    assert [i for i, n in ids.items() if n > 1] == []
    assert [t for t, n in texts.items() if n > 1] == []


def test_the_tools_are_openai_functions_with_valid_schemas() -> None:
    raw = json.loads(TOOL_SET.read_text())
    names = TOOL_SET_DATA.names()
    assert len(set(names)) == len(names)
    for tool in raw["tools"]:
        assert tool["type"] == "function" and set(tool) == {"type", "function"}
        function = tool["function"]
        assert function["name"].isidentifier() and function["description"].strip()
        jsonschema.Draft202012Validator.check_schema(function["parameters"])
        assert function["parameters"]["type"] == "object"
        for prop in function["parameters"]["properties"].values():
            assert prop.get("description"), function["name"]
    assert set(raw["results"]) == set(names)
    ga = TOOL_SET_DATA.realtime_tools()
    assert [t["name"] for t in ga] == names and all(t["type"] == "function" for t in ga)
    assert all("parameters" in t and "function" not in t for t in ga)


def test_every_expected_call_names_a_tool_and_its_arguments_fit_the_schema() -> None:
    for request in TOOL_SET_DATA.requests:
        if request.expect is None:
            continue
        schema = TOOL_SET_DATA.schema(request.expect.name)
        assert schema is not None, request.id
        example = example_arguments(request.expect)
        jsonschema.validate(example, schema)
        assert set(schema.get("required", [])) <= set(example), request.id
        assert (
            judge(request, [Call(request.expect.name, json.dumps(example))], TOOL_SET_DATA) is None
        )
        # and the tool has an answer for it (the --server mode sends it back)
        assert "unknown" not in tool_result(
            TOOL_SET_DATA, Call(request.expect.name, json.dumps(example))
        )


LAMP = Request("r", "Make the lamp red.", "tuning", Expect("set_lamp", {"color": "red"}))
TIMER = Request(
    "t",
    "A ten minute timer for the pasta.",
    "tuning",
    Expect("start_timer", {"minutes": 10, "label": {"contains": "Pasta"}}),
)
CHAT = Request("c", "What is a lamp made of?", "held_out", None)


@pytest.mark.parametrize(
    ("request_", "calls", "problem"),
    [
        (LAMP, [Call("set_lamp", '{"color": "red"}')], None),
        (LAMP, [], "no call"),
        (LAMP, [Call("open_door", '{"door": "front"}')], "called open_door, not set_lamp"),
        (LAMP, [Call("set_lamp", '{"color": "blue"}')], "color is 'blue', not 'red'"),
        (LAMP, [Call("set_lamp", '{"color": "crimson"}')], "arguments break the schema"),
        (LAMP, [Call("set_lamp", '{"color": "red", "x": 1}')], "arguments break the schema"),
        (LAMP, [Call("set_lamp", '{"color": ')], "arguments are not JSON"),
        (LAMP, [Call("set_lamp", '["red"]')], "arguments are not an object"),
        (LAMP, [Call("set_lamp", '{"color": "red"}')] * 2, "2 calls (set_lamp, set_lamp)"),
        (TIMER, [Call("start_timer", '{"minutes": 10, "label": "my PASTA"}')], None),
        (TIMER, [Call("start_timer", '{"minutes": 10.0, "label": "pasta"}')], None),
        (TIMER, [Call("start_timer", '{"minutes": 10}')], "label missing"),
        (TIMER, [Call("start_timer", '{"minutes": 10, "label": "rice"}')], "label is 'rice'"),
        (TIMER, [Call("start_timer", '{"minutes": "10", "label": "pasta"}')], "arguments break"),
        (TIMER, [Call("start_timer", '{"minutes": 0, "label": "pasta"}')], "arguments break"),
        (TIMER, [Call("start_timer", '{"minutes": 11, "label": "pasta"}')], "minutes is 11"),
        (CHAT, [], None),
        (CHAT, [Call("set_lamp", '{"color": "red"}')], "called set_lamp where no tool"),
    ],
)
def test_a_call_is_right_only_when_it_is_the_one_needed(
    request_: Request, calls: list[Call], problem: str | None
) -> None:
    found = judge(request_, calls, TOOL_SET_DATA)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found


def test_exact_values_tell_booleans_from_numbers() -> None:
    schema = {"type": "object", "properties": {"n": {}}}
    assert argument_problem(schema, {"n": 1}, '{"n": true}') == "n is True, not 1"
    assert argument_problem(schema, {"n": True}, '{"n": true}') is None
    assert argument_problem(schema, {}, "") is None  # no arguments: an empty object


def test_scores_per_split_and_together() -> None:
    outcomes = [
        *[Outcome("tuning", True, True, None)] * 9,
        Outcome("tuning", True, True, "called get_time, not set_lamp"),
        *[Outcome("tuning", False, False, None)] * 19,
        Outcome("tuning", False, True, "called set_lamp where no tool was needed"),
        *[Outcome("held_out", True, True, None)] * 3,
        Outcome("held_out", True, False, "no call"),
        Outcome("held_out", False, False, None),
        Outcome("held_out", False, False, "error: TimeoutError"),  # wrong, but no call
    ]
    scores = score(outcomes)
    assert list(scores) == ["tuning", "held_out", "all"]
    assert scores["tuning"] == {
        "tool_requests": 10,
        "right": 9,
        "right_pct": 90.0,
        "no_tool_requests": 20,
        "false_calls": 1,
        "false_call_pct": 5.0,
        "meets_goals": True,
    }
    held = scores["held_out"]
    assert (held["right"], held["right_pct"], held["false_calls"]) == (3, 75.0, 0)
    assert held["false_call_pct"] == 0.0 and not held["meets_goals"]
    together = scores["all"]
    assert (together["tool_requests"], together["right"], together["right_pct"]) == (14, 12, 85.7)
    assert (together["no_tool_requests"], together["false_calls"]) == (22, 1)
    assert together["false_call_pct"] == 4.5 and not together["meets_goals"]


def test_scores_without_requests_of_a_kind_say_none() -> None:
    only_free = score([Outcome("held_out", False, True, "called get_time where no tool")])
    assert only_free["held_out"]["right_pct"] is None
    assert only_free["held_out"]["false_call_pct"] == 100.0
    assert not only_free["all"]["meets_goals"]
    assert score([]) == {
        "all": {
            "tool_requests": 0,
            "right": 0,
            "right_pct": None,
            "no_tool_requests": 0,
            "false_calls": 0,
            "false_call_pct": None,
            "meets_goals": False,
        }
    }


def test_a_tool_answers_with_the_call_s_arguments() -> None:
    lamp = Call("set_lamp", '{"color": "red"}')
    assert tool_result(TOOL_SET_DATA, lamp) == "Done: the lamp is now red."
    assert "unknown" in tool_result(TOOL_SET_DATA, Call("set_lamp", "{}"))
    assert "unknown" in tool_result(TOOL_SET_DATA, Call("set_lamp", "not json"))
    assert tool_result(TOOL_SET_DATA, Call("get_time", "")).startswith("It is 14:05")
    assert tool_result(TOOL_SET_DATA, Call("no_such_tool", "{}")) == "Done."
