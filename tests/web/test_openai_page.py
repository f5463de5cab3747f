"""A browser page written the way OpenAI's Realtime WebRTC guide writes it, against this server:
only the URL changes (tests/web/openai_guide/index.html). Chromium's fake microphone asks two
questions, each answered; then a typed message gets exactly one response. Every server event
the page received validates against the ``openai`` package's models.

The guide's page asks for the microphone with Chromium's defaults: echo cancellation on. With
it, speech the fake microphone plays while the reply plays is not heard at all (the same
speech after the reply is), so barge-in is tested with aiortc (tests/server/
test_realtime_calls.py) and with the demo page, which turns echo cancellation off."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from playwright.sync_api import Browser, Page, sync_playwright
from pydantic import TypeAdapter

from client.cli import save_wav
from tests.support.browser import launch, wait_for
from tests.support.server_process import ServerProcess, server_process, tone_env
from tests.support.speech import silence, speak

T = TypeVar("T")
GUIDE_PAGE = Path(__file__).parent / "openai_guide"
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
SENTENCE_MS = 1000
# a reply (its "As told" sentence and 3 tones: 4 s) starts about 0.7 s after the question ends
# (the end-of-turn silence); the second question comes well after it
SECOND_AFTER_MS = 12_000

server = server_process(
    {"server.web_dir": str(GUIDE_PAGE), "transport.video": "false"},
    pipeline="tests.support.tone_pipeline:create_instructed",
    env=tone_env(SENTENCE_MS, 3),
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """Chromium whose microphone asks twice, then is quiet."""
    wav = tmp_path_factory.mktemp("mic") / "guide.wav"
    question = speak("What time does the harbour museum open today?")
    second = speak("And is there a cafe inside?")
    audio = [silence(1500), question, silence(SECOND_AFTER_MS), second, silence(60_000)]
    save_wav(wav, np.concatenate(audio))
    with sync_playwright() as pw:
        chromium = launch(pw, wav, loop=False)
        yield chromium
        chromium.close()


def until(page: Page, check: Callable[[], T | None], timeout: float, what: str) -> T:
    """``wait_for`` naming the events the page received when it fails."""
    try:
        return wait_for(check, timeout, what)
    except AssertionError as exc:
        kinds = [e["type"] for e in received(page)]
        raise AssertionError(f"{exc}; the page received {kinds}") from None


def received(page: Page, kind: str | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = page.evaluate("() => window.received")
    return events if kind is None else [e for e in events if e["type"] == kind]


def test_the_guide_page_talks_to_this_server(server: ServerProcess, browser: Browser) -> None:
    page = browser.new_page()
    try:
        page.goto(server.url + "/")
        until(page, lambda: page.evaluate("() => window.connected"), 20, "the events channel")
        until(page, lambda: len(received(page, "response.done")) >= 2, 60, "two spoken replies")
        spoken = received(page, "response.done")
        assert [d["response"]["status"] for d in spoken] == ["completed", "completed"]
        transcript = spoken[0]["response"]["output"][0]["content"][0]["transcript"]
        assert transcript.startswith("As told:")
        assert len(received(page, "input_audio_buffer.speech_started")) == 2
        n = len(received(page, "response.created"))
        content = [{"type": "input_text", "text": "And when does it close?"}]
        item = {"type": "message", "role": "user", "content": content}
        page.evaluate(
            "(e) => window.sendEvent(e)", {"type": "conversation.item.create", "item": item}
        )
        page.evaluate("(e) => window.sendEvent(e)", {"type": "response.create"})
        until(page, lambda: len(received(page, "response.done")) >= 3, 40, "the typed reply")
        assert len(received(page, "response.created")) == n + 1  # exactly one response
        typed = received(page, "response.done")[2]
        assert typed["response"]["status"] == "completed"
        events = received(page)
        counts: Counter[str] = Counter()
        for event in events:
            if event["type"].startswith("x-avatar."):
                continue
            assert SERVER_EVENT.validate_python(event).type == event["type"]
            counts[event["type"]] += 1
        print(f"\nChromium: {sum(counts.values())} GA events of {len(counts)} types validated")
        assert {"input_audio_buffer.speech_started", "output_audio_buffer.started"} <= set(counts)
        frames = page.evaluate(
            """async () => {
              const el = document.getElementById('remote');
              return el.srcObject ? el.srcObject.getAudioTracks().length : 0;
            }"""
        )
        assert frames == 1  # the model's audio track plays in the page's audio element
    finally:
        page.close()
