"""A screenshot of the demo page mid-conversation, on the real models (for the README).

    unshare --net sh -c 'ip link set lo up; exec .venv/bin/python -m tests.web.screenshot'

Starts the server with its default pipeline (Whisper, vLLM, Piper: about a minute to load),
asks a spoken question through Chromium's fake microphone, then types two more, interrupts the
first typed answer and captures the page while the avatar speaks the last one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from playwright.sync_api import Page

from client.cli import save_wav
from tests.support.browser import chromium, events, open_page, wait_for
from tests.support.server_process import ROOT, ServerProcess
from tests.support.speech import silence, speak

QUESTION = "What is the capital of France?"
INTERRUPTED = "Tell me a long story about a brave little cat."
LAST = "What is the tallest mountain in the world?"


def spoken_chunks(page: Page) -> int:
    return len(page.query_selector_all('.msg.agent .chunk:not([data-state="queued"])'))


def type_message(page: Page, text: str) -> None:
    page.fill("#message", text)
    page.press("#message", "Enter")


def converse(page: Page, out: Path, theme: str) -> None:
    page.check("#headphones")
    page.click("#start")
    wait_for(lambda: page.evaluate("() => window.avatarDemo.state") == "connected", 60, "connect")
    wait_for(lambda: events(page, "response.done"), 60, "the answer to the spoken question")
    type_message(page, INTERRUPTED)
    before = spoken_chunks(page)
    wait_for(lambda: spoken_chunks(page) > before, 60, "the story to start")
    time.sleep(2.0)
    page.click("#interrupt")
    wait_for(lambda: len(events(page, "response.done")) >= 2, 10, "the story to stop")
    type_message(page, LAST)
    before = spoken_chunks(page)
    wait_for(lambda: spoken_chunks(page) > before, 60, "the last answer to start")
    time.sleep(0.7)
    page.mouse.move(0, 0)  # no hover or focus marks in the picture
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.screenshot(path=str(out))
    print(f"saved {out} ({theme})")
    page.click("#stop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    server = ServerProcess({"transport.connect_timeout_s": "60"}).start(timeout=400)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "question.wav"
            save_wav(wav, np.concatenate([silence(1500), speak(QUESTION), silence(1000)]))
            with chromium(wav, loop=False) as browser, open_page(browser, server.url) as page:
                page.emulate_media(color_scheme=args.theme)
                converse(page, args.out, args.theme)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
