"""The chat messages of a context with calls (server/pipeline/voice.py ``to_messages``): what a
chat template that calls tools renders, and what a model that cannot is shown."""

from __future__ import annotations

from typing import Any

import pytest

from server.pipeline.seams import ReplyRequest, TurnTrace
from server.pipeline.voice import to_messages
from server.runtime.conditions import Conditions
from server.runtime.history import CacheClass, ContextEntry, Role
from server.runtime.tools import FunctionCall, FunctionTool, ToolSettings
from tests.support.stand_ins import stand_in_pipeline

TOOLS = ToolSettings((FunctionTool("get_time", "The time now."),))
CALL = FunctionCall("call_1", "get_time", '{"zone": "UTC"}')
CONTEXT = (
    ContextEntry(CacheClass.ANCHOR, Role.SYSTEM, "You are kind."),
    ContextEntry(CacheClass.RECENT, Role.USER, "What time is it?"),
    ContextEntry(CacheClass.RECENT, Role.ASSISTANT, "Let me check."),
    ContextEntry(CacheClass.RECENT, Role.ASSISTANT, "", CALL),
    ContextEntry(CacheClass.RECENT, Role.TOOL, "14:05", call_id="call_1"),
)


def test_calls_join_the_words_before_them_and_outputs_are_tool_messages() -> None:
    messages = to_messages(CONTEXT, TOOLS)
    assert messages[0]["tools"] == [TOOLS.tools[0].as_chat()]
    assert messages[2] == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "type": "function",
                "id": "call_1",
                "function": {"name": "get_time", "arguments": {"zone": "UTC"}},
            }
        ],
    }
    assert messages[3] == {"role": "tool", "content": "14:05"}
    assert len(messages) == 4


def test_a_model_that_calls_no_tools_is_shown_no_calls() -> None:
    messages = to_messages(CONTEXT)
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert all("tools" not in m and "tool_calls" not in m for m in messages)


class _Llm:
    """An engine with ``stream_tools`` whose model may have no format for calls."""

    def __init__(self, calls_tools: bool) -> None:
        self.calls_tools = calls_tools
        self.asked: list[tuple[str, list[Any]]] = []

    async def stream(
        self, messages: Any, request_id: str, max_tokens: int, *, cache_salt: str | None = None
    ) -> Any:
        self.asked.append(("stream", list(messages)))
        yield "It is two."

    async def stream_tools(
        self, messages: Any, request_id: str, max_tokens: int, **kwargs: Any
    ) -> Any:
        self.asked.append(("stream_tools", list(messages)))
        yield "It is two."

    def last_stats(self, request_id: str) -> None:
        return None

    async def abort(self, request_id: str) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("calls_tools", [True, False])
async def test_tools_go_only_to_a_model_with_a_call_format(calls_tools: bool) -> None:
    """SmolLM2 (the model ladder's bottom) has none: it is asked without tools, and talks."""
    llm = _Llm(calls_tools)
    pipeline = stand_in_pipeline(llm)
    request = ReplyRequest("s" * 32, 0, CONTEXT[:2], Conditions("p", "joe", "a"), tools=TOOLS)
    try:
        said = [piece async for piece in pipeline.reply(request, TurnTrace(endpoint_ms=0))]
    finally:
        await pipeline.close()
    assert said == ["It is two."]
    ((kind, messages),) = llm.asked
    assert kind == ("stream_tools" if calls_tools else "stream")
    assert ("tools" in messages[0]) == calls_tools
