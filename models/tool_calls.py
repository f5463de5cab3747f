"""Function calls in the Hermes/Qwen format, engine-agnostic (no server imports).

Tools come as OpenAI Chat-style dicts, ``{"type": "function", "function": {"name": ...,
"description": ..., "parameters": <JSON schema>}}`` (what a Qwen chat template's
``tools | tojson`` lists too). A model calls one by writing::

    <tool_call>
    {"name": "set_lamp", "arguments": {"color": "red"}}
    </tool_call>

Small models also write the JSON object alone, at the start of their reply (Qwen2.5-Coder-0.5B
does so every time); :class:`CallScanner` finds either start in a stream of text deltas. An
engine then decodes the call itself under :func:`call_schema` (a grammar), and
:func:`check_call` validates what came out before anybody runs it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Tool = Mapping[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}

CALL_MARK = "<tool_call>"  # starts a call in the Hermes format
CALL_END = "</tool_call>"
# a call's JSON written without the marker, alone or in a Markdown code block (compared with
# the text's whitespace taken out): start -> the call's form
BARE_STARTS = {'{"name"': "bare", '```json{"name"': "fenced", '```{"name"': "fenced"}
# a call's form -> the text before and after its JSON object, as a prompt continues it
CALL_FORMS = {
    "marker": (CALL_MARK + "\n", "\n" + CALL_END),
    "bare": ("", "\n"),  # the model writes '"}}\n' as one token: a prompt ending in '"}}' ends it
    "fenced": ("```json\n", "\n```"),
}
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCall:
    """One validated call: the tool's name and its arguments as compact JSON object text."""

    name: str
    arguments: str


def tool_parameters(tools: Sequence[Tool]) -> dict[str, dict[str, Any]]:
    """Each tool's name -> its parameters' JSON schema (an empty object's when it has none);
    ValueError for a tool that is no OpenAI-style function, or a name given twice."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type", "function") != "function":
            raise ValueError(f"not a function tool: {tool!r:.200}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a function tool without a name: {tool!r:.200}")
        if name in found:
            raise ValueError(f"two tools named {name!r}")
        parameters = function.get("parameters") or NO_PARAMETERS
        if not isinstance(parameters, Mapping):
            raise ValueError(f"tool {name!r}: parameters must be a JSON schema object")
        found[name] = dict(parameters)
    return found


def call_schema(tools: Sequence[Tool], only: str | None = None) -> dict[str, Any]:
    """The JSON schema of one call, ``{"name": <const>, "arguments": <the tool's
    parameters>}``: an anyOf over the tools (or just ``only``), name first, in the form
    llama.cpp's json_schema-to-grammar takes (const, anyOf, ordered required properties).
    ValueError for no tools or an unknown ``only``."""
    parameters = tool_parameters(tools)
    if only is not None:
        if only not in parameters:
            raise ValueError(f"no tool named {only!r}")
        parameters = {only: parameters[only]}
    if not parameters:
        raise ValueError("no tools to call")
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": _closed(schema)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, schema in parameters.items()
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """An object schema that lists its properties and says nothing of others, closed to
    others (as OpenAI's strict mode does): llama.cpp's grammar would let a model invent
    arguments for a tool that takes none (Qwen2.5-Coder-0.5B writes the schema itself)."""
    if "properties" in schema and "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema


def check_call(text: str, tools: Sequence[Tool]) -> ToolCall | None:
    """The call that ``text`` (one ``{"name": ..., "arguments": {...}}`` object) makes, its
    arguments validated against the tool's schema; None, with a warning logged, for bad JSON,
    an unknown tool, or arguments that fail the schema. Never raises."""
    from jsonschema import exceptions, validators

    try:
        parameters = tool_parameters(tools)
        found = json.loads(text)
    except ValueError as e:
        log.warning("tool call refused: %s: %.200r", e, text)
        return None
    if not isinstance(found, dict) or not isinstance(found.get("name"), str):
        log.warning("tool call refused: no name: %.200r", text)
        return None
    name = found["name"]
    arguments = found.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's form: the object as text
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            log.warning("tool call %s refused: arguments are no JSON: %.200r", name, text)
            return None
    if name not in parameters:
        log.warning("tool call refused: no tool named %r", name)
        return None
    if not isinstance(arguments, dict):
        log.warning("tool call %s refused: arguments are no object: %.200r", name, text)
        return None
    schema = parameters[name]
    try:
        validator = validators.validator_for(schema)
        validator.check_schema(schema)
        error = exceptions.best_match(validator(schema).iter_errors(arguments))
    except exceptions.SchemaError as e:
        log.warning("tool %s has a bad parameters schema: %s", name, e.message)
        return None
    if error is not None:
        log.warning("tool call %s refused: %s", name, error.message)
        return None
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False, separators=(",", ":")))


class CallScanner:
    """Finds where a call starts in a stream of text deltas (pure, no I/O).

    :meth:`feed` returns the text that is safe to pass on: it holds back a tail that could be
    the start of ``<tool_call>``, and, while only whitespace came before (``bare``), a start
    that could be a bare ``{"name"`` object (or one in a Markdown code block). Once a start
    is seen, :attr:`found` is true, :attr:`form` says which, :attr:`before` is all the text
    before it (what was passed on) and later deltas are ignored. At the stream's end,
    :meth:`flush` returns what was held back.
    """

    def __init__(self, *, bare: bool = True) -> None:
        self.found = False
        self.form = ""  # once found: how the call is written, a key of CALL_FORMS
        self.before = ""  # the text passed on so far
        self._held = ""  # text not yet passed on
        self._bare = bare  # a bare object may still start (only whitespace so far)

    def feed(self, delta: str) -> str:
        """Take one delta; the text now safe to pass on ("" while it could start a call)."""
        if self.found:
            return ""
        text = self._held + delta
        if self._bare:
            compact = "".join(text.split())
            for start, form in BARE_STARTS.items():
                if compact.startswith(start):
                    return self._start(text, len(text) - len(text.lstrip()), form)
            if any(start.startswith(compact) for start in BARE_STARTS):
                self._held = text
                return ""
            self._bare = False
        at = text.find(CALL_MARK)
        if at >= 0:
            return self._start(text, at, "marker")
        keep = _marker_prefix(text)
        self._held = text[len(text) - keep :]
        return self._pass(text[: len(text) - keep])

    def flush(self) -> str:
        """The text held back, at the end of a stream in which no call started."""
        if self.found:
            return ""
        rest, self._held = self._held, ""
        return self._pass(rest)

    def _start(self, text: str, at: int, form: str) -> str:
        self.found = True
        self.form = form
        self._held = ""
        return self._pass(text[:at])

    def _pass(self, text: str) -> str:
        self.before += text
        return text


def _marker_prefix(text: str) -> int:
    """The length of the longest tail of ``text`` that ``<tool_call>`` starts with."""
    for n in range(min(len(text), len(CALL_MARK) - 1), 0, -1):
        if CALL_MARK.startswith(text[-n:]):
            return n
    return 0
