"""Function calling: the tools a session offers its agent, which of them a reply may call, and
the calls a reply makes (OpenAI Realtime's ``session.tools``, ``tool_choice`` and
``function_call`` items).

A tool runs in the client (an app, a game engine, the Agents SDK's ``tool()``): the server only
tells it the call and waits for its ``function_call_output``. These values know no wire and no
model; server/wire/realtime_tools.py parses them from client events, and the LLM stage gives the
tools to the engine as chat-template tools (``as_chat``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MAX_TOOLS = 32  # per session or response
MAX_DESCRIPTION_CHARS = 1024
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class FunctionTool:
    """A function the agent may call: ``parameters`` is its arguments' JSON schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: dict(NO_PARAMETERS), hash=False)

    def as_chat(self) -> dict[str, Any]:
        """The tool as chat templates (and OpenAI's chat API) take it."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}

    def as_session(self) -> dict[str, Any]:
        """The tool as the GA session object lists it."""
        body = {"type": "function", "name": self.name, "description": self.description}
        return {**body, "parameters": self.parameters}


class ChoiceMode(StrEnum):
    """Whether a reply may, must or must not call a tool (``FUNCTION``: that one)."""

    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"
    FUNCTION = "function"


@dataclass(frozen=True)
class ToolChoice:
    """OpenAI's ``tool_choice``: a mode, or the one function a reply must call (``name``)."""

    mode: ChoiceMode = ChoiceMode.AUTO
    name: str = ""

    def for_engine(self) -> str:
        """The engine's word for it: auto, none, required, or the function's name."""
        return self.name if self.mode is ChoiceMode.FUNCTION else self.mode.value

    def as_session(self) -> str | dict[str, str]:
        if self.mode is ChoiceMode.FUNCTION:
            return {"type": "function", "name": self.name}
        return self.mode.value


@dataclass(frozen=True)
class ToolSettings:
    """The tools a reply is offered and its choice among them."""

    tools: tuple[FunctionTool, ...] = ()
    choice: ToolChoice = ToolChoice()

    @property
    def callable(self) -> bool:
        """Whether a reply under these settings may call a tool at all."""
        return bool(self.tools) and self.choice.mode is not ChoiceMode.NONE

    def as_chat(self) -> list[dict[str, Any]]:
        return [tool.as_chat() for tool in self.tools]

    def named(self, name: str) -> FunctionTool | None:
        return next((tool for tool in self.tools if tool.name == name), None)


NO_TOOLS = ToolSettings()


@dataclass(frozen=True)
class FunctionCall:
    """A call the agent made: ``arguments`` is a JSON object's text; ``call_id`` pairs it with
    its ``function_call_output``."""

    call_id: str
    name: str
    arguments: str

    def arguments_object(self) -> Any:
        """The arguments parsed (what a chat template renders); {} when they do not parse."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return {}
