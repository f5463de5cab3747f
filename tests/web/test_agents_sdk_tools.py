"""Function calling through OpenAI's Agents SDK (``@openai/agents-realtime``) in Chromium, on the
server's real default models (the embedded LLM makes the call).

The page is tests/web/agents_sdk/app.js with ``?tools=1``: its agent has one ``tool()``,
``get_time``, that returns a fixed "It is 14:05 in the afternoon." and records each run. The
app's backend mints the key as in tests/web/test_agents_sdk.py; the SDK connects over WebRTC
(``POST /v1/realtime/calls``) and declares the tool with its ``session.update``. A typed "What
time is it?" (``session.sendMessage``) is answered by a reply that calls ``get_time``: the SDK
runs it in the browser, sends its ``function_call_output`` and asks for the next reply, which
speaks from it; that reply's transcript says the time (14:05, or five past two).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from client.cli import save_wav
from tests.support.browser import launch
from tests.support.server_process import ServerProcess, server_process
from tests.support.speech import silence
from tests.web.test_agents_sdk import BUNDLE, TOKEN, AppBackend, events, realtime_url, state, until

pytestmark = pytest.mark.timeout(600)

THE_TIME = "It is 14:05 in the afternoon."  # what get_time returns (app.js)
SAYS_THE_TIME = re.compile(r"\b14\b|14:05|2:05|\btwo\b|fourteen", re.IGNORECASE)


@pytest.fixture(scope="module")
def backend() -> Iterator[AppBackend]:
    """The app's page and backend, on its own port (another origin than the server's)."""
    if not BUNDLE.exists():
        raise RuntimeError(f"{BUNDLE} is missing: run scripts/setup.sh (npm ci, esbuild)")
    site = AppBackend()
    site.thread.start()
    yield site
    site.httpd.shutdown()
    site.httpd.server_close()


def settings(backend: AppBackend) -> dict[str, str]:
    return {"server.cors_origins": backend.origin, "transport.video": "false"}


# the real default models (no pipeline.factory), as tests/models/test_realtime_ws_e2e.py
server = server_process(
    settings, env={"AVATAR_SERVER_AUTH_TOKENS": TOKEN}, timeout=400, log_tail=3000
)


@pytest.fixture
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """A Chromium whose microphone hears silence: only the typed question is asked."""
    wav = tmp_path_factory.mktemp("mic") / "silence.wav"
    save_wav(wav, silence(1000))
    with sync_playwright() as pw:
        chromium = launch(pw, wav)
        yield chromium
        chromium.close()


def function_calls(page: Page) -> list[dict[str, Any]]:
    """The function call items in the SDK's history (its ``output`` once it ran)."""
    return [item for item in state(page)["history"] if item.get("type") == "function_call"]


def replies_after(page: Page, at: float) -> list[dict[str, Any]]:
    """The ``response`` of each completed ``response.done`` after ``at`` (page ms)."""
    done = [e["response"] for e in events(page, "response.done", at)]
    return [r for r in done if r.get("status") == "completed"]


def spoken(response: dict[str, Any]) -> str:
    """The transcript of a response's assistant message ("" if it has none)."""
    for item in response.get("output") or []:
        if item.get("type") == "message":
            return " ".join(
                str(c.get("transcript") or c.get("text") or "") for c in item["content"]
            )
    return ""


def replies_summary(page: Page) -> list[str]:
    """Each ``response.done``: its status (and why) and what its output held."""
    out = []
    for event in events(page, "response.done"):
        response = event["response"]
        why = (response.get("status_details") or {}).get("reason")
        held = [
            o.get("name") or spoken({"output": [o]}) or o.get("type")
            for o in response.get("output") or []
        ]
        out.append(f"{response.get('status')}{f' ({why})' if why else ''}: {held}")
    out.append(f"tool runs: {len(state(page)['toolRuns'])}")
    return out


def test_the_agents_sdk_runs_a_tool_the_model_calls_and_the_reply_speaks_its_result(
    server: ServerProcess, backend: AppBackend, browser: Browser
) -> None:
    backend.server_url = server.url
    page = browser.new_page()
    try:
        page.goto(f"{backend.origin}/index.html?tools=1")
        page.evaluate(
            "(o) => window.agents.start(o)",
            {"transport": "webrtc", "url": realtime_url(server, "webrtc")},
        )
        # the SDK declared the agent's tool and the server took it
        updated = until(
            page,
            lambda: [
                e
                for e in events(page, "session.updated")
                if any(t.get("name") == "get_time" for t in e["session"].get("tools") or [])
            ],
            30,
            "session.updated with get_time",
        )
        (tool,) = updated[-1]["session"]["tools"]
        assert tool["type"] == "function" and tool["name"] == "get_time", tool

        asked = page.evaluate("() => window.agents.send('What time is it?')")
        # the model calls get_time: the GA events, then the SDK runs the tool in the page
        done = until(
            page,
            lambda: events(page, "response.function_call_arguments.done", asked),
            120,
            "the model to call get_time",
        )
        assert done[0]["name"] == "get_time", done[0]
        runs = until(page, lambda: state(page)["toolRuns"], 30, "the SDK to run get_time")
        assert len(runs) == 1, runs
        # (the SDK runs it at response.output_item.done, before the reply's response.done)
        called = until(
            page,
            lambda: [
                r
                for r in replies_after(page, asked)
                if any(o.get("id") == done[0]["item_id"] for o in r.get("output") or [])
            ],
            10,
            "the response.done that holds the function_call item",
        )
        (item,) = [o for o in called[0]["output"] if o.get("id") == done[0]["item_id"]]
        assert item["type"] == "function_call" and item["name"] == "get_time", item
        assert item["call_id"] == done[0]["call_id"], (item, done[0])
        until(
            page,
            lambda: [c for c in function_calls(page) if c.get("output") == THE_TIME],
            10,
            "the tool's output in the SDK's history",
        )

        # the reply after the output speaks the time
        try:
            answer = until(
                page,
                lambda: [r for r in replies_after(page, runs[0]["at"]) if spoken(r)],
                120,
                "the spoken reply after the tool's output",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; replies: {replies_summary(page)}") from None
        said = spoken(answer[0])
        assert SAYS_THE_TIME.search(said), f"the reply does not say the time: {said!r}"
        assert state(page)["errors"] == []
        print(f"\nAgents SDK tool call: get_time ran once; the reply said {said!r}")
    finally:
        page.close()
