"""Function calling in client events (OpenAI Realtime GA): ``tools`` and ``tool_choice`` of a
session or a response, and the ``function_call`` / ``function_call_output`` items a client
adds. Each is parsed and checked whole; a malformed one is a ProtocolError naming the field,
and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema

from server.runtime.tools import (
    MAX_DESCRIPTION_CHARS,
    MAX_TOOLS,
    NAME,
    NO_PARAMETERS,
    ChoiceMode,
    FunctionCall,
    FunctionTool,
    ToolChoice,
)
from server.wire.protocol import ProtocolError, quoted

MAX_OUTPUT_CHARS = 4000  # a function call's output, as the model reads it
MAX_ARGUMENTS_CHARS = 4000
MAX_CALL_ID_CHARS = 64


@dataclass(frozen=True)
class CallOutputCreate:
    """The output of the function call ``call_id`` (``item_id``: the client's, or None).
    ``answer``: it is answered by itself (the native dialect, which has no
    ``response.create``)."""

    call_id: str
    output: str
    item_id: str | None = None
    event_id: str | None = None
    answer: bool = False


@dataclass(frozen=True)
class ToolsUpdate:
    """A native ``session.update`` that sets the session's ``tools`` and/or ``tool_choice``
    (None: unchanged), with its other fields (``changes``: persona, voice, appearance)."""

    tools: tuple[FunctionTool, ...] | None
    tool_choice: ToolChoice | None
    changes: dict[str, object]
    event_id: str | None = None


@dataclass(frozen=True)
class CallCreate:
    """A function call a client adds to the conversation (a history it replays)."""

    call: FunctionCall
    item_id: str | None = None
    event_id: str | None = None


def _refuse(message: str, param: str, event_id: str | None, code: str = "invalid_value") -> None:
    raise ProtocolError(code, message, event_id, param)


def _name(value: object, param: str, event_id: str | None) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        _refuse(f"{param} must be 1 to 64 letters, digits, _ or -", param, event_id)
    assert isinstance(value, str)
    return value


def _tool(value: object, param: str, event_id: str | None) -> FunctionTool:
    if not isinstance(value, dict):
        _refuse(f"{param} must be an object", param, event_id)
    assert isinstance(value, dict)
    kind = value.get("type", "function")
    if kind != "function":
        _refuse(
            f"only function tools are supported, not {quoted(kind)} (MCP: not on this server)",
            f"{param}.type",
            event_id,
            "unsupported_feature",
        )
    name = _name(value.get("name"), f"{param}.name", event_id)
    description = value.get("description") or ""
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
        limit = MAX_DESCRIPTION_CHARS
        _refuse(f"description must be a string of at most {limit} characters", param, event_id)
    parameters = value.get("parameters")
    if parameters is None:
        parameters = dict(NO_PARAMETERS)
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        _refuse("parameters must be a JSON schema of an object", f"{param}.parameters", event_id)
    assert isinstance(parameters, dict)
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.path) or "its root"
        _refuse(f"parameters is no valid JSON schema (at {where})", f"{param}.parameters", event_id)
    return FunctionTool(name, description, parameters)


def parse_tools(value: object, param: str, event_id: str | None) -> tuple[FunctionTool, ...]:
    """A ``tools`` list: function tools with distinct names, at most MAX_TOOLS."""
    if not isinstance(value, list):
        _refuse(f"{param} must be a list", param, event_id)
    assert isinstance(value, list)
    if len(value) > MAX_TOOLS:
        _refuse(f"at most {MAX_TOOLS} tools", param, event_id)
    tools = tuple(_tool(tool, f"{param}[{i}]", event_id) for i, tool in enumerate(value))
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        _refuse("two tools have the same name", param, event_id)
    return tools


def parse_tool_choice(
    value: object, tools: tuple[FunctionTool, ...] | None, param: str, event_id: str | None
) -> ToolChoice:
    """``tool_choice``: auto, none, required, or ``{"type": "function", "name": ...}`` (a name
    among ``tools`` where they are given with it)."""
    if isinstance(value, str):
        modes = {m.value for m in ChoiceMode} - {ChoiceMode.FUNCTION.value}
        if value not in modes:
            _refuse("tool_choice is auto, none, required or a function", param, event_id)
        return ToolChoice(ChoiceMode(value))
    if not isinstance(value, dict) or value.get("type") != "function":
        _refuse('tool_choice is a mode or {"type": "function", "name": ...}', param, event_id)
    assert isinstance(value, dict)
    name = _name(value.get("name"), f"{param}.name", event_id)
    if tools is not None and name not in {tool.name for tool in tools}:
        _refuse(f"tool_choice names no tool given: {quoted(name)}", f"{param}.name", event_id)
    return ToolChoice(ChoiceMode.FUNCTION, name)


def _call_id(value: object, event_id: str | None) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_CALL_ID_CHARS:
        message = f"item.call_id must be a string of 1 to {MAX_CALL_ID_CHARS} characters"
        _refuse(message, "item.call_id", event_id)
    assert isinstance(value, str)
    return value


def parse_call_item(
    item: dict[str, Any], item_id: str | None, event_id: str | None
) -> CallOutputCreate | CallCreate:
    """A ``function_call_output`` or ``function_call`` item of ``conversation.item.create``."""
    call_id = _call_id(item.get("call_id"), event_id)
    if item.get("type") == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str) or len(output) > MAX_OUTPUT_CHARS:
            message = f"item.output must be a string of at most {MAX_OUTPUT_CHARS} characters"
            _refuse(message, "item.output", event_id)
        assert isinstance(output, str)
        return CallOutputCreate(call_id, output, item_id, event_id)
    name = _name(item.get("name"), "item.name", event_id)
    arguments = item.get("arguments", "{}")
    if not isinstance(arguments, str) or len(arguments) > MAX_ARGUMENTS_CHARS:
        _refuse("item.arguments must be a JSON object's text", "item.arguments", event_id)
    assert isinstance(arguments, str)
    return CallCreate(FunctionCall(call_id, name, arguments), item_id, event_id)
