"""The avatar's own actions as tools its replies may call (``avatar.builtin_tools``).

Unlike a client's tools these run in the server, at once, when the reply calls them: an
expression or a look at the user goes on the conversation's :class:`Gestures`, a new appearance
through the session's boundary-aligned condition update (from the next chunk on). Their output
goes back to the LLM as JSON text, an error included (bad arguments never raise).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jsonschema import exceptions, validators

from server.avatar.gestures import Gestures
from server.avatar.seam import Expression
from server.errors import InvalidConditionUpdate
from server.runtime.tools import FunctionCall, FunctionTool

SHOW_EXPRESSION = "show_expression"
SET_APPEARANCE = "set_appearance"
LOOK_AT_USER = "look_at_user"
BUILTIN_NAMES = frozenset((SHOW_EXPRESSION, SET_APPEARANCE, LOOK_AT_USER))
EXPRESSION_MS = 2500.0  # how long show_expression shows one
LOOK_MS = 2000.0  # how long look_at_user looks
MAX_ERROR_CHARS = 300  # of a schema error's message in an output (it quotes the value)
# the expressions a reply may show, by the tool's word for each
EXPRESSIONS: Mapping[str, Expression] = {
    "smile": Expression.SMILING,
    "surprise": Expression.SURPRISED,
    "thinking": Expression.THINKING,
}

_DESCRIPTIONS = {
    SHOW_EXPRESSION: (
        "Show a facial expression on your face for about 2 seconds while you talk. Use "
        "'smile' for something nice or funny, 'surprise' for something unexpected, 'thinking' "
        "when you consider something. Also answer in words as usual."
    ),
    SET_APPEARANCE: (
        "Change how you look (your avatar's appearance) when the user asks you to look "
        "different. It changes from your next sentence on."
    ),
    LOOK_AT_USER: (
        "Look straight at the user for about 2 seconds, to make a point or to show you are "
        "paying attention. Also answer in words as usual."
    ),
}


def _parameters(name: str, appearances: Sequence[str] | None) -> dict[str, Any]:
    """A built-in tool's arguments schema; ``appearances`` None: any appearance name (the
    session's condition update then checks it)."""
    if name == SHOW_EXPRESSION:
        expression = {
            "type": "string",
            "enum": list(EXPRESSIONS),
            "description": "smile, surprise or thinking",
        }
        return _object(expression=expression)
    if name == SET_APPEARANCE:
        look: dict[str, Any] = {"type": "string", "minLength": 1}
        if appearances is not None:
            look = {**look, "enum": list(appearances)}
            look["description"] = "the look to change to: " + ", ".join(appearances)
        return _object(appearance=look)
    return _object()


def _object(**properties: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if properties:
        schema["required"] = list(properties)
    return {**schema, "additionalProperties": False}


def builtin_tools(appearances: Sequence[str]) -> tuple[FunctionTool, ...]:
    """The avatar's tools: ``show_expression``, ``set_appearance`` (left out without
    ``appearances``: no renderer, no looks to choose) and ``look_at_user``."""
    names = [SHOW_EXPRESSION, SET_APPEARANCE, LOOK_AT_USER]
    if not appearances:
        names.remove(SET_APPEARANCE)
    return tuple(
        FunctionTool(name, _DESCRIPTIONS[name], _parameters(name, tuple(appearances)))
        for name in names
    )


def is_builtin(name: str) -> bool:
    """Whether a call of ``name`` is the avatar's own (run here, not by the client)."""
    return name in BUILTIN_NAMES


def run_builtin(
    call: FunctionCall,
    gestures: Gestures,
    request_update: Callable[[dict[str, object]], None],
) -> str | None:
    """Carry out ``call`` if it names a built-in tool, and return its output (JSON text:
    ``{"ok": true, ...}``, or ``{"ok": false, "error": ...}`` for bad arguments or an unknown
    appearance); None for any other tool. Never raises for what the call says.

    ``request_update``: the session's ``request_update`` (a new appearance applies at the next
    chunk boundary; it raises InvalidConditionUpdate for a value the session does not take)."""
    if call.name not in BUILTIN_NAMES:
        return None
    arguments, error = _arguments(call.name, call.arguments)
    if error is not None:
        return _output(ok=False, error=error)
    if call.name == SHOW_EXPRESSION:
        word = arguments["expression"]
        gestures.show(EXPRESSIONS[word], EXPRESSION_MS)
        return _output(ok=True, expression=word)
    if call.name == LOOK_AT_USER:
        gestures.look_at_user(LOOK_MS)
        return _output(ok=True, looking_at_user=True)
    appearance = arguments["appearance"]
    try:
        request_update({"appearance": appearance})
    except InvalidConditionUpdate as e:
        return _output(ok=False, error=str(e))
    return _output(ok=True, appearance=appearance)


def _arguments(name: str, text: str) -> tuple[dict[str, Any], str | None]:
    """The call's arguments parsed and checked against the tool's schema, or an error."""
    try:
        arguments = json.loads(text) if text.strip() else {}
    except ValueError as e:
        return {}, f"{name}: the arguments are not JSON ({e})"
    if not isinstance(arguments, dict):
        return {}, f"{name}: the arguments must be a JSON object"
    schema = _parameters(name, None)
    problem = exceptions.best_match(validators.validator_for(schema)(schema).iter_errors(arguments))
    if problem is not None:
        where = ".".join(str(p) for p in problem.absolute_path)
        return {}, f"{name}: {where + ': ' if where else ''}{problem.message[:MAX_ERROR_CHARS]}"
    return arguments, None


def _output(**fields: object) -> str:
    return json.dumps(fields)
