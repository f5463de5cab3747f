"""OpenAI's Agents SDK (``@openai/agents-realtime``, pinned in tests/web/agents_sdk/) in Chromium,
as an app uses it: the page (tests/web/agents_sdk/app.js, bundled by scripts/setup.sh) is served
from another origin than the server, which has tokens on and allows that origin (CORS). The
page's server is the app's backend: it mints an ``ek_`` key with the server token (``POST
/v1/realtime/client_secrets``) when the page asks, and the SDK connects with it.

Each transport holds one conversation: a spoken question (Chromium's fake microphone), a typed
one (``session.sendMessage``) answered with audio, and a typed one interrupted while its reply
plays (``session.interrupt()``); the SDK reports no ``error`` all along. The page measures the
audio it plays with an AnalyserNode (RMS every 20 ms). Printed: the connect time
(``session.connect`` until it resolves: the SDK waits for ``session.updated``) and, from
``sendMessage``, the first audio as the server announces it (WebRTC: ``output_audio_buffer.
started``; WebSocket: the first ``response.output_audio.delta``) and as the page hears it (the
first 20 ms above ``LOUD``).

WebRTC: the SDK opens the microphone and plays the remote track itself. WebSocket (``GET
/v1/realtime``, the key as the subprotocol ``openai-insecure-api-key.<key>``): the app records
and plays PCM16 at 24 kHz, and the SDK truncates the reply on interrupt. That part is skipped,
saying why, while the server refuses the handshake with a client secret."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from client.cli import save_wav
from tests.support.browser import launch, wait_for
from tests.support.server_process import ServerProcess, free_port, server_process, tone_env
from tests.support.speech import silence, speak

T = TypeVar("T")
PAGE_DIR = Path(__file__).parent / "agents_sdk"
BUNDLE = PAGE_DIR / "dist" / "app.js"
TOKEN = "agents-sdk-test-token-4f1c9e"  # the app backend's server token
INSTRUCTIONS = "You are the museum guide. Answer in one sentence."  # the agent's (app.js)
SENTENCE_MS = 1000  # a reply: its "As told" sentence and 3 tones, 4 s
QUESTION_AFTER_MS = 3000  # of microphone silence first: the SDK connects meanwhile
LOUD = 0.02  # RMS (of 1.0) of a 20 ms the page hears as the reply's audio
QUIET_WITHIN_MS = 1000  # after interrupt(): the page's audio is silent by then


class AppBackend:
    """The page's origin: its files, and ``POST /key``, which mints a client secret with the
    server token (``server_url`` is set once the server runs); ``minted``: the keys."""

    def __init__(self) -> None:
        self.port = free_port()
        self.origin = f"http://127.0.0.1:{self.port}"
        self.server_url = ""
        self.minted: list[str] = []
        backend = self

        class Handler(SimpleHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != "/key":
                    self.send_error(404)
                    return
                body = json.dumps(backend.mint()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(
            ("127.0.0.1", self.port), partial(Handler, directory=str(PAGE_DIR))
        )
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def mint(self) -> dict[str, Any]:
        """A key from the server, as an app's backend asks for one."""
        request = urllib.request.Request(
            self.server_url + "/v1/realtime/client_secrets",
            data=json.dumps({"expires_after": {"anchor": "created_at", "seconds": 60}}).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
        self.minted.append(answer["value"])
        return answer


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


server = server_process(
    settings,
    pipeline="tests.support.tone_pipeline:create_instructed",
    env={"AVATAR_SERVER_AUTH_TOKENS": TOKEN, **tone_env(SENTENCE_MS, 3)},
)


@pytest.fixture(scope="module")
def microphone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Silence while the SDK connects, one question, then silence."""
    wav = tmp_path_factory.mktemp("mic") / "question.wav"
    question = speak("What time does the harbour museum open today?")
    save_wav(wav, np.concatenate([silence(QUESTION_AFTER_MS), question, silence(90_000)]))
    return wav


@pytest.fixture
def browser(microphone: Path) -> Iterator[Browser]:
    """A Chromium of its own for each test: its fake microphone starts with the capture."""
    with sync_playwright() as pw:
        chromium = launch(pw, microphone, loop=False)
        yield chromium
        chromium.close()


def state(page: Page) -> dict[str, Any]:
    found: dict[str, Any] = page.evaluate("() => window.agents.state")
    return found


def events(page: Page, kind: str, after: float = 0.0) -> list[dict[str, Any]]:
    """The server events of type ``kind`` the SDK received after ``after`` (page ms)."""
    return [e for e in state(page)["events"] if e["type"] == kind and e["at"] > after]


def until(page: Page, check: Callable[[], T | None], timeout: float, what: str) -> T:
    """``wait_for`` naming the SDK's errors and the events it received when it fails."""
    try:
        return wait_for(check, timeout, what)
    except AssertionError as exc:
        seen = state(page)
        kinds = [e["type"] for e in seen["events"] if e["type"] != "response.output_audio.delta"]
        raise AssertionError(f"{exc}; errors {seen['errors']}; events {kinds}") from None


def first_loud(page: Page, after: float) -> float | None:
    """When the page's audio was first louder than LOUD after ``after`` (page ms)."""
    return next((t for t, level in state(page)["levels"] if t > after and level > LOUD), None)


def loud_after(page: Page, after: float) -> list[float]:
    """When the page's audio was louder than LOUD after ``after`` (page ms)."""
    return [t for t, level in state(page)["levels"] if t > after and level > LOUD]


def assistant_items(page: Page) -> list[tuple[str, str]]:
    """The status and transcript of each assistant message in the SDK's history."""
    found = []
    for item in state(page)["history"]:
        if item.get("role") == "assistant":
            text = " ".join(c.get("transcript") or "" for c in item["content"])
            found.append((item["status"], text))
    return found


def assistant_transcripts(page: Page) -> list[str]:
    return [text for _, text in assistant_items(page)]


def talk(page: Page, transport: str, server: ServerProcess, backend: AppBackend) -> None:
    """One conversation through the SDK on ``transport``; prints what it measured."""
    page.goto(f"{backend.origin}/index.html")
    connect_ms = page.evaluate(
        "(o) => window.agents.start(o)",
        {"transport": transport, "url": realtime_url(server, transport)},
    )
    assert backend.minted and backend.minted[-1].startswith("ek_")

    # the spoken question, from the fake microphone
    until(page, lambda: events(page, "response.done"), 40, "the reply to the spoken question")
    done = events(page, "response.done")
    assert done[0]["response"]["status"] == "completed"
    assert events(page, "conversation.item.input_audio_transcription.completed")
    until(page, lambda: assistant_transcripts(page), 10, "the reply in the SDK's history")
    assert assistant_transcripts(page)[0].startswith("As told: " + INSTRUCTIONS)  # the agent's
    wait_for(lambda: not loud_after(page, state(page)["levels"][-1][0] - 500), 20, "its end")

    # a typed question, answered with audio
    sent = page.evaluate("() => window.agents.send('And when does it close?')")
    started = (
        "output_audio_buffer.started" if transport == "webrtc" else "response.output_audio.delta"
    )
    until(page, lambda: events(page, started, sent), 20, "the typed reply's audio")
    heard = until(page, lambda: first_loud(page, sent), 20, "the typed reply heard")
    until(page, lambda: events(page, "response.done", sent), 30, "the typed reply done")
    assert events(page, "response.done", sent)[0]["response"]["status"] == "completed"
    announced_ms = events(page, started, sent)[0]["at"] - sent
    wait_for(lambda: len(assistant_transcripts(page)) >= 2, 10, "the typed reply in history")
    wait_for(lambda: not loud_after(page, state(page)["levels"][-1][0] - 500), 20, "its end")

    # a typed question, interrupted while its reply plays
    asked = page.evaluate("() => window.agents.send('Tell me about the ships.')")
    playing = until(page, lambda: first_loud(page, asked), 20, "the third reply heard")
    wait_for(lambda: (state(page)["levels"][-1][0] - playing) > 500, 5, "half a second of it")
    stopped = page.evaluate("() => window.agents.interrupt()")
    until(page, lambda: events(page, "response.done", asked), 10, "the interrupted reply done")
    assert events(page, "response.done", asked)[0]["response"]["status"] == "cancelled"
    # WebRTC: the SDK sent response.cancel and output_audio_buffer.clear; WebSocket:
    # response.cancel and conversation.item.truncate at the audio it played
    if transport == "webrtc":
        until(page, lambda: events(page, "output_audio_buffer.cleared", stopped), 5, "cleared")
    else:
        assert state(page)["interrupted"] >= 1  # the SDK's audio_interrupted
        played_ms = stopped - events(page, "response.output_audio.delta", asked)[0]["at"]
        cut = until(
            page,
            lambda: [
                e
                for e in events(page, "conversation.item.truncated", stopped)
                if e["audio_end_ms"] <= played_ms + 50
            ],
            5,
            "the reply truncated at what the page played",
        )
        assert cut[-1]["audio_end_ms"] >= played_ms - 300
    until(page, lambda: assistant_items(page)[-1][0] == "incomplete", 5, "the reply cut")
    assert len(assistant_items(page)[-1][1]) < len(assistant_items(page)[0][1])
    wait_for(lambda: state(page)["levels"][-1][0] - stopped > QUIET_WITHIN_MS + 1500, 10, "time")
    late = [t - stopped for t in loud_after(page, stopped + QUIET_WITHIN_MS)]
    assert not late, f"audio {late[:3]} ms after interrupt()"
    quiet_ms = max([t - stopped for t in loud_after(page, stopped)], default=0.0)

    assert state(page)["errors"] == []
    print(
        f"\nAgents SDK 0.20.0, {transport}: connect {connect_ms:.0f} ms; typed message to "
        f"first audio: {announced_ms:.0f} ms announced, {heard - sent:.0f} ms heard; "
        f"interrupt() to silence {quiet_ms:.0f} ms"
    )


def realtime_url(server: ServerProcess, transport: str) -> str:
    """The SDK's URL for ``transport``: the calls endpoint, or the WebSocket."""
    if transport == "webrtc":
        return server.url + "/v1/realtime/calls"
    return server.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"


async def socket_refusal(url: str, key: str, origin: str) -> str | None:
    """Why ``GET /v1/realtime`` refuses a browser's handshake with a client secret, with the
    server's answer (None: it opens and says ``session.created``)."""
    protocols = ("realtime", f"openai-insecure-api-key.{key}", "openai-agents-sdk.0.20.0")
    async with aiohttp.ClientSession() as http:
        try:
            async with http.ws_connect(url, protocols=protocols, headers={"Origin": origin}) as ws:
                first = await ws.receive_json(timeout=10)
        except aiohttp.WSServerHandshakeError as exc:
            status = exc.status
        except (aiohttp.ClientError, TimeoutError, TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        else:
            kind = first.get("type")
            return None if kind == "session.created" else f"first event {kind!r}, not created"
        # again as a plain request, to read the answer (a refused handshake spends no key)
        headers = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
            "Sec-WebSocket-Protocol": ", ".join(protocols),
            "Origin": origin,
        }
        async with http.get(url.replace("ws://", "http://", 1), headers=headers) as answer:
            body = (await answer.text())[:300] if answer.status != 101 else ""
    return f"HTTP {status} {body}".strip()


def test_the_agents_sdk_over_webrtc(
    server: ServerProcess, backend: AppBackend, browser: Browser
) -> None:
    backend.server_url = server.url
    page = browser.new_page()
    try:
        talk(page, "webrtc", server, backend)
    finally:
        page.close()


def test_the_agents_sdk_over_a_websocket(
    server: ServerProcess, backend: AppBackend, browser: Browser
) -> None:
    backend.server_url = server.url
    url = realtime_url(server, "websocket")
    probe = socket_refusal(url, backend.mint()["value"], backend.origin)
    with ThreadPoolExecutor(1) as pool:  # playwright's loop runs in this thread
        refused = pool.submit(asyncio.run, probe).result()
    if refused is not None:
        pytest.skip(f"GET /v1/realtime refuses a client secret: {refused}")
    page = browser.new_page()
    try:
        talk(page, "websocket", server, backend)
    finally:
        page.close()
