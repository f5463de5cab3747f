"""Function calls: the scanner that finds a call's start in a stream, one call's JSON schema
and its validation (pure), the chat template's tools and calls, and the llama.cpp engine's
schema-constrained calls on the real Qwen2.5-Coder-0.5B GGUF (no mocks)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from models.llamacpp import MAX_CALLS, LlamaCppEngine, LlamaCppOptions, call_start_probability
from models.llm import LlmError, Message
from models.prompt_text import ChatText
from models.tool_calls import CallScanner, ToolCall, call_schema, check_call

pytestmark = pytest.mark.timeout(300)
on_module_loop = pytest.mark.asyncio(loop_scope="module")

QWEN_GGUF = Path(__file__).parents[2] / ".cache/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
needs_qwen = pytest.mark.skipif(
    not QWEN_GGUF.is_file(),
    reason=f"no Qwen2.5-Coder-0.5B GGUF at {QWEN_GGUF} (run python -m models.prepare)",
)
SYSTEM = "You are a helpful home assistant."
SCOPE = "tool-tests"  # one slot for the engine tests: the prompt with the tools is read once


def tool(name: str, description: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if properties:
        parameters["required"] = list(properties)
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


COLORS = ["red", "green", "blue", "white", "off"]
TOOLS = [
    tool("set_lamp", "Set the colour of the lamp", {"color": {"type": "string", "enum": COLORS}}),
    tool("get_time", "Tell the current time"),
    tool("start_timer", "Start a timer", {"minutes": {"type": "integer", "minimum": 1}}),
    tool("get_weather", "The weather in a city", {"city": {"type": "string"}}),
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def ask(question: str) -> list[Message]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def scan(deltas: Sequence[str], *, bare: bool = True) -> tuple[str, CallScanner]:
    scanner = CallScanner(bare=bare)
    passed = "".join(scanner.feed(d) for d in deltas)
    return passed + scanner.flush(), scanner


# --------------------------------------------------------------------------- the scanner


def test_text_without_a_call_passes_whole() -> None:
    passed, scanner = scan(["Hello", ", how", " are you?"])
    assert passed == "Hello, how are you?" and not scanner.found


def test_the_marker_is_found_in_one_delta_or_in_pieces() -> None:
    for deltas in (["Sure.\n<tool_call>", "\n{"], ["Sure.\n<", "tool", "_", "call", ">\n"]):
        passed, scanner = scan(deltas)
        assert scanner.found and scanner.form == "marker"
        assert passed == scanner.before == "Sure.\n"


def test_a_possible_marker_is_held_back_until_it_diverges() -> None:
    scanner = CallScanner()
    assert scanner.feed("I see a <") == "I see a "
    assert scanner.feed("tool") == ""
    assert scanner.feed("box>") == "<toolbox>"
    assert scanner.flush() == "" and not scanner.found


def test_a_bare_call_counts_only_at_the_start() -> None:
    passed, scanner = scan(['{"', "name", '":', ' "x"'])
    assert scanner.found and scanner.form == "bare" and passed == ""
    passed, scanner = scan(["\n```", "json\n", "{\n ", ' "name"'])
    assert scanner.found and scanner.form == "fenced" and scanner.before == "\n"
    passed, scanner = scan(["Use ", '{"name": 1}'])
    assert not scanner.found and passed == 'Use {"name": 1}'
    passed, scanner = scan(['{"na', "tion"])
    assert not scanner.found and passed == '{"nation'
    _, scanner = scan(['{"name"'], bare=False)
    assert not scanner.found


def test_deltas_after_the_start_are_ignored() -> None:
    scanner = CallScanner()
    assert scanner.feed("<tool_call>") == ""
    assert scanner.feed("more") == "" and scanner.flush() == ""


# --------------------------------------------------------------------------- schema and check


def test_the_call_schema_is_an_any_of_with_the_name_first() -> None:
    schema = call_schema(TOOLS)
    assert [v["properties"]["name"] for v in schema["anyOf"]] == [
        {"const": t["function"]["name"]} for t in TOOLS
    ]
    for variant in schema["anyOf"]:
        assert list(variant["properties"]) == ["name", "arguments"]
        assert variant["properties"]["arguments"]["additionalProperties"] is False
    only = call_schema(TOOLS, "get_weather")
    assert only["properties"]["name"] == {"const": "get_weather"}
    jsonschema.validate({"name": "get_weather", "arguments": {"city": "Oslo"}}, only)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "set_lamp", "arguments": {"color": "red"}}, only)
    with pytest.raises(ValueError):
        call_schema(TOOLS, "fly")
    with pytest.raises(ValueError):
        call_schema([])


def test_check_call_validates_and_compacts() -> None:
    text = '{"name": "set_lamp", "arguments": {"color": "red"}}'
    assert check_call(text, TOOLS) == ToolCall("set_lamp", '{"color":"red"}')
    as_text = json.dumps({"name": "start_timer", "arguments": '{"minutes": 5}'})
    assert check_call(as_text, TOOLS) == ToolCall("start_timer", '{"minutes":5}')
    assert check_call('{"name": "get_time", "arguments": {}}', TOOLS) == ToolCall("get_time", "{}")


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"name": "fly", "arguments": {}}',
        '{"name": "set_lamp", "arguments": {"color": "purple"}}',
        '{"name": "set_lamp", "arguments": {}}',
        '{"name": "start_timer", "arguments": {"minutes": "five"}}',
        '{"name": "start_timer", "arguments": "{oops"}',
        '{"name": "get_time", "arguments": [1]}',
        '["set_lamp"]',
        '{"arguments": {}}',
    ],
)
def test_check_call_refuses_without_raising(text: str, caplog: pytest.LogCaptureFixture) -> None:
    assert check_call(text, TOOLS) is None
    assert "refused" in caplog.text


def test_check_call_refuses_a_bad_tool_schema(caplog: pytest.LogCaptureFixture) -> None:
    bad = [{"type": "function", "function": {"name": "x", "parameters": {"type": 5}}}]
    assert check_call('{"name": "x", "arguments": {}}', bad) is None
    assert "bad parameters schema" in caplog.text


# --------------------------------------------------------------------------- the template


@pytest.fixture(scope="module")
def qwen_chat() -> ChatText:
    if not QWEN_GGUF.is_file():
        pytest.skip(f"no Qwen2.5-Coder-0.5B GGUF at {QWEN_GGUF}")
    return ChatText.from_gguf(QWEN_GGUF)


def test_tools_are_listed_as_written_and_none_change_nothing(qwen_chat: ChatText) -> None:
    chat = ask("Please turn the lamp red.")
    assert qwen_chat.calls_tools
    assert qwen_chat.render(chat, None) == qwen_chat.render(chat) == qwen_chat.render(chat, [])
    text = qwen_chat.render(chat, TOOLS)
    assert "# Tools" not in qwen_chat.render(chat) and "# Tools" in text
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text  # keys in order, no HTML escapes
    assert text.endswith("<|im_start|>assistant\n")


def test_a_call_and_its_response_render(qwen_chat: ChatText) -> None:
    chat: list[Message] = [
        *ask("Turn the lamp blue."),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "set_lamp", "arguments": '{"color": "blue"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'},
    ]
    text = qwen_chat.render(chat, TOOLS)
    call = '<tool_call>\n{"name": "set_lamp", "arguments": {"color": "blue"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in text
    assert '<|im_start|>user\n<tool_response>\n{"ok": true}\n</tool_response><|im_end|>' in text


# --------------------------------------------------------------------------- the engine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[LlamaCppEngine]:
    if not QWEN_GGUF.is_file():
        pytest.skip(f"no Qwen2.5-Coder-0.5B GGUF at {QWEN_GGUF} (run python -m models.prepare)")
    threads = max(1, min(4, os.cpu_count() or 1))
    options = LlamaCppOptions(slots=2, threads=threads, batch_threads=threads)
    started = await LlamaCppEngine.start(QWEN_GGUF, options)
    yield started
    await started.close()


async def reply(
    engine: LlamaCppEngine, chat: list[Message], request_id: str, choice: str = "auto"
) -> list[str | ToolCall]:
    stream = engine.stream_tools(chat, request_id, 48, tools=TOOLS, choice=choice, cache_salt=SCOPE)
    return [item async for item in stream]


def calls_in(items: list[str | ToolCall]) -> list[ToolCall]:
    found = [item for item in items if isinstance(item, ToolCall)]
    for call in found:  # every call's arguments hold to its tool's schema
        jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])
    return found


@needs_qwen
@on_module_loop
async def test_auto_calls_the_lamp_and_reuses_the_slot(engine: LlamaCppEngine) -> None:
    items = await reply(engine, ask("Please turn the lamp red."), "lamp")
    assert calls_in(items) == [ToolCall("set_lamp", '{"color":"red"}')]
    stats = engine.last_stats("lamp")
    assert stats is not None and stats.ttft_ms is not None and stats.finish_reason == "stop"
    # the call's prompt computed only the tokens after what the held text left in the slot
    assert stats.prompt_tokens - stats.cached_tokens <= 8, stats


@needs_qwen
@on_module_loop
async def test_auto_answers_small_talk_with_text(engine: LlamaCppEngine) -> None:
    items = await reply(engine, ask("Hello, how are you?"), "hello")
    assert not calls_in(items)
    assert "".join(str(i) for i in items).strip()


@needs_qwen
@on_module_loop
async def test_required_and_named_choices_always_call(engine: LlamaCppEngine) -> None:
    required = await reply(engine, ask("Hello, how are you?"), "required", "required")
    assert required and len(calls_in(required)) == len(required)
    named = await reply(engine, ask("What's the weather in Paris?"), "named", "get_weather")
    assert [c.name for c in calls_in(named)] == ["get_weather"] and len(named) == 1


@needs_qwen
@on_module_loop
async def test_none_only_talks(engine: LlamaCppEngine) -> None:
    items = await reply(engine, ask("Please turn the lamp red."), "none", "none")
    assert items and all(isinstance(i, str) for i in items)
    with pytest.raises(LlmError):
        engine.stream_tools(ask("Hi"), "bad", 8, tools=TOOLS, choice="fly")


@needs_qwen
@on_module_loop
async def test_several_calls_in_a_row(engine: LlamaCppEngine) -> None:
    chat: list[Message] = [
        *ask("Turn the lamp blue."),
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "set_lamp", "arguments": {"color": "blue"}}}],
        },
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Now make it green and tell me the time."},
    ]
    calls = calls_in(await reply(engine, chat, "several"))
    assert 2 <= len(calls) <= MAX_CALLS
    assert calls[0] == ToolCall("set_lamp", '{"color":"green"}')
    assert calls[1] == ToolCall("get_time", "{}")


@needs_qwen
@on_module_loop
async def test_abort_in_the_middle_of_a_call(engine: LlamaCppEngine) -> None:
    stream = engine.stream_tools(
        ask("What's the weather in Paris?"),
        "abort",
        48,
        tools=TOOLS,
        choice="get_weather",
        cache_salt=SCOPE,
    )
    first = asyncio.ensure_future(anext(stream))
    for _ in range(3000):  # until the constrained call has decoded a token or two
        run = engine._requests.get("abort")
        if run is not None and run.tallies and run.tallies[-1].deltas >= 2:
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the call never started")
    await engine.abort("abort")
    with pytest.raises(StopAsyncIteration):
        await first
    assert engine.running() == 0
    stats = engine.last_stats("abort")
    assert stats is not None and stats.finish_reason == "abort" and stats.ttft_ms is None
    # the slot is free again: the next request of that scope runs
    assert calls_in(await reply(engine, ask("What time is it?"), "after", "get_time"))


@needs_qwen
@on_module_loop
async def test_after_its_output_a_call_is_not_made_again_the_reply_talks(
    engine: LlamaCppEngine,
) -> None:
    """The 0.5B calls again what it has just been answered; the same call (name and
    arguments) since the user last spoke is not made twice: the reply speaks from the
    output."""
    call = {"type": "function", "id": "call_1", "function": {"name": "get_time", "arguments": {}}}
    chat = [
        *ask("What time is it?"),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "It is 14:05 in the afternoon."},
    ]
    items = await reply(engine, chat, "answered")
    assert not calls_in(items)
    said = "".join(str(i) for i in items)
    assert said.strip() and "{" not in said


def test_the_call_start_probability_sums_the_tokens_that_begin_a_call() -> None:
    def top(token: str, p: float) -> dict[str, Any]:
        return {"id": 0, "token": token, "logprob": math.log(p)}

    found = [{"choices": [{"logprobs": {"content": [{"top_logprobs": [
        top("Sure", 0.6), top("<tool_call>", 0.1), top(" {", 0.05), top("To", 0.2)
    ]}]}}]}]  # fmt: skip
    assert call_start_probability(found) == pytest.approx(0.15)
    with pytest.raises(LlmError):
        call_start_probability([{"error": "no slot"}])


@needs_qwen
@on_module_loop
async def test_a_call_gate_starts_the_reply_with_a_call_where_the_model_would_talk(
    engine: LlamaCppEngine,
) -> None:
    """With the gate at 0 every reply that may call starts with one, small talk too; a reply
    to a call's output still only talks."""
    options = dataclasses.replace(engine.options, call_gate=0.0)
    gated = await LlamaCppEngine.start(QWEN_GGUF, options)
    try:
        items = await reply(gated, ask("Hello, how are you?"), "gated")
        assert items and isinstance(items[0], ToolCall), items
        call = {
            "type": "function",
            "id": "call_1",
            "function": {"name": "get_time", "arguments": {}},
        }
        chat = [
            *ask("What time is it?"),
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"time": "14:05"}'},
        ]
        answer = await reply(gated, chat, "answer")
        assert answer and all(isinstance(i, str) for i in answer), answer
    finally:
        await gated.close()
