"""Debian's Chromium driven by Python playwright (no browser download), with a fake microphone.

Run inside the loopback-only network namespace together with the server. Chromium runs as
root there, so it needs ``--no-sandbox``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from playwright.sync_api import Browser, Page, Playwright, ViewportSize, sync_playwright

from tests.support.pace import Patience

CHROMIUM = Path("/usr/bin/chromium")
PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1280, "height": 800}

GRANT_MEDIA = "--use-fake-ui-for-media-stream"  # answers permission prompts with "allow"

# Chromium's flags for a headless, offline, media-capable run (without the background-networking
# ones it keeps trying hosts the closed network refuses; without loopback-in-peer-connection it
# gathers no candidates on loopback).
BASE_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    GRANT_MEDIA,
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]


def chromium_args(
    microphone_wav: Path | None, loop: bool = True, grant_media: bool = True
) -> list[str]:
    """Flags; the fake microphone plays ``microphone_wav`` (mono 16-bit PCM, as
    ``client.cli.save_wav`` writes it; looped unless ``loop`` is False). Without
    ``grant_media`` no permission prompt is answered for the page (headless: denied)."""
    args = [a for a in BASE_ARGS if grant_media or a != GRANT_MEDIA]
    if microphone_wav is not None:
        suffix = "" if loop else "%noloop"
        args.append(f"--use-file-for-fake-audio-capture={microphone_wav}{suffix}")
    return args


def launch(
    pw: Playwright, microphone_wav: Path | None, loop: bool = True, grant_media: bool = True
) -> Browser:
    """A headless Chromium whose fake microphone plays ``microphone_wav``. One playwright
    instance (``sync_playwright()``) can launch several; close each."""
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    return pw.chromium.launch(
        executable_path=str(CHROMIUM),
        args=chromium_args(microphone_wav, loop, grant_media),
        ignore_default_args=["--mute-audio"],
        timeout=30_000,
    )


@contextmanager
def chromium(
    microphone_wav: Path | None, loop: bool = True, grant_media: bool = True
) -> Iterator[Browser]:
    """A playwright instance with one such browser, for scripts."""
    with sync_playwright() as pw:
        browser = launch(pw, microphone_wav, loop, grant_media)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def open_page(
    browser: Browser,
    url: str,
    viewport: ViewportSize | None = None,
    errors: list[str] | None = None,
    requests: list[str] | None = None,
) -> Iterator[Page]:
    """A fresh context and page at ``url``; uncaught errors and console errors of the page are
    appended to ``errors``, the URLs it requests to ``requests``."""
    context = browser.new_context(viewport=viewport or DESKTOP)
    page = context.new_page()
    if requests is not None:
        page.on("request", lambda request: requests.append(request.url))
    found = errors if errors is not None else []
    page.on("pageerror", lambda exc: found.append(f"pageerror: {exc}"))
    page.on(
        "console",
        lambda msg: found.append(f"console: {msg.text}") if msg.type == "error" else None,
    )
    page.goto(url)
    try:
        yield page
    finally:
        context.close()


OUTBOUND_VIDEO_JS = """
async () => {
  const pc = window.avatarDemo.pc;
  let sent = 0;
  if (pc) (await pc.getStats()).forEach((s) => {
    if (s.type === 'outbound-rtp' && s.kind === 'video') sent += s.framesEncoded ?? 0;
  });
  return sent;
}
"""

INBOUND_STATS_JS = """
async () => {
  const pc = window.avatarDemo.pc;
  if (!pc) return null;
  const out = {audio: null, video: null};
  (await pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'audio') out.audio = {
      audioLevel: s.audioLevel ?? 0, packetsReceived: s.packetsReceived ?? 0,
      totalSamplesDuration: s.totalSamplesDuration ?? 0, jitter: s.jitter ?? null};
    if (s.type === 'inbound-rtp' && s.kind === 'video') out.video = {
      framesDecoded: s.framesDecoded ?? 0, frameWidth: s.frameWidth ?? 0};
  });
  return out;
}
"""


def camera_frames_sent(page: Page) -> int:
    """Video frames the page has encoded and sent (its camera)."""
    return int(page.evaluate(OUTBOUND_VIDEO_JS))


def inbound_stats(page: Page) -> dict[str, Any] | None:
    """The page's inbound-rtp audio and video figures from ``RTCPeerConnection.getStats()``."""
    result = page.evaluate(INBOUND_STATS_JS)
    return None if result is None else dict(result)


T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None], timeout: float, what: str, page: Page | None = None
) -> T:
    """Poll ``check`` every 0.1 s until it returns something truthy; fail naming ``what`` (and
    the events ``page`` received). ``timeout`` is in seconds on the reference machine,
    stretched by the measured pace (tests/support/pace.py)."""
    patience = Patience(timeout)
    while True:
        value = check()
        if value:
            return value
        if not patience.left():
            seen = "" if page is None else f"; page events: {event_summary(page)}"
            waited = patience.describe()
            raise AssertionError(f"timed out after {waited} waiting for {what}{seen}")
        time.sleep(0.1)


def events(page: Page, kind: str | None = None) -> list[dict[str, Any]]:
    """Server events the demo page received (``kind``: only that type)."""
    received: list[dict[str, Any]] = page.evaluate("() => window.avatarDemo.events")
    return [e for e in received if kind is None or e["type"] == kind]


def event_summary(page: Page) -> str:
    """The page's received events in order, runs of one type counted (for failure messages)."""
    runs: list[list[Any]] = []
    for event in events(page):
        status = event.get("status") or (event.get("response") or {}).get("status")
        label = event["type"] + (f"({status})" if status else "")
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return ", ".join(f"{label} x{n}" if n > 1 else label for label, n in runs)
