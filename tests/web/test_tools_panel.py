"""The demo page's Tools panel (web/tools.js) in Chromium, against the server on the tone pipeline.

What is real here: the page, its ``oai-events`` channel, and the server's answer to the tools
the page declares (``session.updated`` carrying them). What is not: the tone pipeline has no
LLM, so it never calls a tool. The function calls below are GA
``response.function_call_arguments.done`` events that the test hands to the page's tool
handler itself (``window.avatarDemo.tools.onEvent``, the hook app.js calls with every server
event); these tests check the page's handler (it runs the tool, shows it, and answers on the
channel), not that the server makes calls. What the page sends is recorded below
``RTCDataChannel.send`` (an init script wraps it), so it is what went out on the channel.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from client.cli import save_wav
from tests.support.browser import events, launch, wait_for
from tests.support.server_process import ServerProcess, server_process, tone_env
from tests.support.speech import silence

pytestmark = pytest.mark.timeout(90)

TOOL_NAMES = ["set_lamp", "start_timer"]

# Every client event the page sends on its events channel, as it went out.
RECORD_CHANNEL_JS = """
window.channelSent = [];
const originalSend = RTCDataChannel.prototype.send;
RTCDataChannel.prototype.send = function (data) {
  if (this.label === 'oai-events' && typeof data === 'string') {
    try { window.channelSent.push(JSON.parse(data)); } catch (e) { /* not JSON: not an event */ }
  }
  return originalSend.call(this, data);
};
"""

server = server_process(
    {"transport.video": "false"},
    pipeline="tests.support.tone_pipeline:create",
    env=tone_env(500, 2),
)


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """A browser whose microphone hears silence: no spoken turn starts a reply."""
    wav = tmp_path_factory.mktemp("mic") / "silence.wav"
    save_wav(wav, silence(1000))
    with sync_playwright() as pw:
        browser = launch(pw, wav)
        yield browser
        browser.close()


@pytest.fixture
def page(quiet: Browser, server: ServerProcess) -> Iterator[Page]:
    context = quiet.new_context()
    context.add_init_script(RECORD_CHANNEL_JS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    opened.goto(server.url)
    try:
        yield opened
        assert errors == [], errors
    finally:
        context.close()


def start(page: Page) -> None:
    page.click("#start")
    wait_for(lambda: page.evaluate("() => window.avatarDemo.state") == "connected", 20, "connected")
    wait_for(lambda: events(page, "x-avatar.session"), 10, "the server's session", page)


def sent(page: Page) -> list[dict[str, Any]]:
    """What the page sent on the channel, playback acknowledgements left out."""
    out: list[dict[str, Any]] = page.evaluate("() => window.channelSent")
    return [e for e in out if e["type"] != "x-avatar.playback.ack"]


def declared(page: Page) -> list[list[str]]:
    """The tool names of each ``session.update`` the page sent that names tools."""
    return [
        [t["name"] for t in e["session"]["tools"]]
        for e in sent(page)
        if e["type"] == "session.update" and "tools" in e["session"]
    ]


def answered_with(page: Page, names: list[str]) -> list[dict[str, Any]]:
    """The server's ``session.updated`` events whose session has exactly tools ``names``."""
    found = []
    for event in events(page, "session.updated"):
        tools = event["session"].get("tools")
        if tools is not None and [t.get("name") for t in tools] == names:
            found.append(event)
    return found


def call(page: Page, event: dict[str, Any]) -> Any:
    """Hand a server event to the page's tool handler, as app.js does with each one."""
    return page.evaluate("(e) => window.avatarDemo.tools.onEvent(e)", event)


def arguments_done(response_id: str, call_id: str, name: str, args: str) -> dict[str, Any]:
    """A GA ``response.function_call_arguments.done``, as the server sends one."""
    return {
        "type": "response.function_call_arguments.done",
        "event_id": f"event_{call_id}",
        "response_id": response_id,
        "item_id": f"item_{call_id}",
        "output_index": 0,
        "call_id": call_id,
        "name": name,
        "arguments": args,
    }


def lamp(page: Page) -> dict[str, str]:
    return dict(
        page.evaluate(
            """() => {
              const lamp = document.getElementById('lamp');
              const style = getComputedStyle(lamp);
              return {colour: lamp.dataset.colour, glow: style.boxShadow,
                      fill: style.getPropertyValue('--lamp').trim(),
                      text: document.getElementById('lamp-text').textContent};
            }"""
        )
    )


def test_tools_off_declares_nothing_and_the_box_declares_them_during_a_call(page: Page) -> None:
    """Unticked (the default) the page sends no tools; ticking the box during a call declares
    both tools (the server answers ``session.updated`` with them), unticking withdraws them."""
    assert not page.is_checked("#tools-on")
    start(page)
    wait_for(lambda: events(page, "session.created"), 5, "session.created", page)
    assert declared(page) == []
    assert not [e for e in sent(page) if e["type"] == "session.update"]

    page.check("#tools-on")
    wait_for(lambda: declared(page), 5, "the tools declared")
    (update,) = [e for e in sent(page) if e["type"] == "session.update"]
    session = update["session"]
    assert session["tool_choice"] == "auto"
    lamp_tool, timer_tool = session["tools"]
    assert lamp_tool["type"] == timer_tool["type"] == "function"
    assert lamp_tool["name"] == "set_lamp" and timer_tool["name"] == "start_timer"
    assert lamp_tool["parameters"]["properties"]["colour"]["enum"] == [
        *("red", "orange", "yellow", "green", "blue", "purple", "white", "off")
    ]
    minutes = timer_tool["parameters"]["properties"]["minutes"]
    assert (minutes["type"], minutes["minimum"], minutes["maximum"]) == ("integer", 1, 60)
    assert timer_tool["parameters"]["required"] == ["minutes"]
    wait_for(lambda: answered_with(page, TOOL_NAMES), 5, "session.updated with the tools", page)
    assert not events(page, "error"), events(page, "error")

    page.uncheck("#tools-on")
    wait_for(lambda: declared(page)[-1:] == [[]], 5, "the tools withdrawn")
    wait_for(lambda: answered_with(page, []), 5, "session.updated without tools", page)


def test_a_function_call_runs_in_the_page_and_its_output_goes_back_on_the_channel(
    page: Page,
) -> None:
    """Ticked before Start, the tools are declared as the session starts. Then the page's
    handler, given GA function-call events by the test: the lamp and the timer change, each
    call shows in the panel and in the transcript, and the page sends the
    ``function_call_output`` then ``response.create`` (after ``response.done`` of the reply
    that made the call; none after a cancelled one); a call delivered twice runs once."""
    page.check("#tools-on")
    start(page)
    wait_for(lambda: declared(page) == [TOOL_NAMES], 5, "the tools declared at the start")
    wait_for(lambda: answered_with(page, TOOL_NAMES), 5, "session.updated with the tools", page)
    assert lamp(page)["colour"] == "off" and lamp(page)["glow"] == "none"

    # a call whose reply the page never saw open: output, then response.create at once
    before = len(sent(page))
    call(page, arguments_done("resp_t1", "call_lamp", "set_lamp", '{"colour": "blue"}'))
    shown = lamp(page)
    assert shown["colour"] == "blue" and shown["text"] == "Lamp blue", shown
    assert shown["fill"] == "rgb(40 90 230)" and shown["glow"] != "none", shown
    out = sent(page)[before:]
    assert [e["type"] for e in out] == ["conversation.item.create", "response.create"], out
    item = out[0]["item"]
    assert item == {
        "type": "function_call_output",
        "call_id": "call_lamp",
        "output": item["output"],
    }
    assert json.loads(item["output"]) == {"ok": True, "lamp": "blue"}
    listed = page.inner_text('#tool-calls li[data-tool="set_lamp"]')
    assert 'set_lamp(colour: "blue")' in listed, listed
    line = page.inner_text('#conversation [data-tool="set_lamp"]')
    assert 'set_lamp(colour: "blue")' in line, line

    # the same event again (a resumed connection replays events): not run twice
    before = len(sent(page))
    call(page, arguments_done("resp_t1", "call_lamp", "set_lamp", '{"colour": "blue"}'))
    assert sent(page)[before:] == []

    # a call in a reply still open: the output at once, response.create after its response.done
    call(page, {"type": "response.created", "response": {"id": "resp_t2", "status": "in_progress"}})
    before = len(sent(page))
    call(
        page,
        arguments_done("resp_t2", "call_timer", "start_timer", '{"minutes": 2, "label": "tea"}'),
    )
    out = sent(page)[before:]
    assert [e["type"] for e in out] == ["conversation.item.create"], out
    assert out[0]["item"]["call_id"] == "call_timer"
    result = json.loads(out[0]["item"]["output"])
    assert result["ok"] is True and result["minutes"] == 2 and result["label"] == "tea", result
    assert page.inner_text("#timer") in ("2:00", "1:59")
    assert page.get_attribute("#timer", "data-state") == "running"
    assert page.inner_text("#timer-label") == "tea"
    wait_for(lambda: page.inner_text("#timer") in ("1:58", "1:57"), 5, "the countdown to run")
    call(page, {"type": "response.done", "response": {"id": "resp_t2", "status": "completed"}})
    assert [e["type"] for e in sent(page)[before:]] == [
        "conversation.item.create",
        "response.create",
    ]

    # a barge-in cancels the reply that made the call: the output is sent, no reply asked for
    call(page, {"type": "response.created", "response": {"id": "resp_t3", "status": "in_progress"}})
    before = len(sent(page))
    call(page, arguments_done("resp_t3", "call_red", "set_lamp", '{"colour": "red"}'))
    call(page, {"type": "response.done", "response": {"id": "resp_t3", "status": "cancelled"}})
    out = sent(page)[before:]
    assert [e["type"] for e in out] == ["conversation.item.create"], out
    assert lamp(page)["colour"] == "red"

    # arguments the tool cannot take: an error as the output, the lamp as it was
    before = len(sent(page))
    call(page, arguments_done("resp_t4", "call_pink", "set_lamp", '{"colour": "pink"}'))
    out = sent(page)[before:]
    assert [e["type"] for e in out] == ["conversation.item.create", "response.create"], out
    assert "error" in json.loads(out[0]["item"]["output"])
    assert lamp(page)["colour"] == "red"
    assert page.get_attribute('#tool-calls li[data-call-id="call_pink"]', "class") == "failed"

    calls = page.evaluate("() => window.avatarDemo.tools.calls.map((c) => c.call_id)")
    assert calls == ["call_lamp", "call_timer", "call_red", "call_pink"]
    lines = page.eval_on_selector_all("#conversation .tool-call", "(ls) => ls.length")
    assert lines == 4
