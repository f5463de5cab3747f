"""The chat messages of a context with calls (server/pipeline/voice.py ``to_messages``): what a
chat template that calls tools renders, and what a model that cannot is shown."""

from __future__ import annotations

from server.pipeline.voice import to_messages
from server.runtime.history import CacheClass, ContextEntry, Role
from server.runtime.tools import FunctionCall, FunctionTool, ToolSettings

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
