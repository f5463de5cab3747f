"""Each kind of client against one server on the embedded default models, measured at the client:

    .venv/bin/python -m benchmarks.clients_bench [--rounds 5] [--quick] [--out PATH]

One server process (``python -m server``, default models and settings, tokens on, the page's
origin allowed by CORS) on loopback in a network namespace. Clients, each round taking its turn
(round 1 of every client, then round 2, ...), every round a new session:

- ``openai_ws``: the ``openai`` package's ``client.realtime.connect()`` on ``GET /v1/realtime``
  (server token; no video);
- ``agents_webrtc`` / ``agents_ws``: OpenAI's Agents SDK (tests/web/agents_sdk bundle) in
  Chromium, page on another origin, an ``ek_`` key minted by its backend; WebRTC
  (``/v1/realtime/calls``, audio only as the SDK offers it) and the WebSocket;
- ``aiortc``: ``client.cli.ClientPeer`` on ``POST /v1/realtime/calls`` (server token, GA
  events channel), receiving audio and video as the demo page does.

A round: connect, a spoken question, its reply played out, a typed question, its reply played
out. The Python clients send the Agents page's instructions (``session.update``) after
connecting, so every client asks the same agent. Measured (ms):

- ``connect``: Python WebSocket: ``connect()`` called -> ``session.created`` received; aiortc:
  offer created -> ``session.created`` on the events channel; Agents SDK: ``session.connect()``
  called -> resolved (the key is minted before; the SDK resolves on ``session.updated``);
- ``typed``: the message sent (``conversation.item.create`` + ``response.create``; the SDK's
  ``sendMessage``) -> the first audible reply audio;
- ``spoken``: the end of the question's speech as the client sent it -> the first audible reply
  audio. The question is the joe voice's (the project's TTS, at a microphone's level). Python
  WebSocket: PCM16 24 kHz appended in 40 ms pieces at real time (a piece sent once "recorded"),
  silence on after it; the end is when its last voiced sample (|s| > 500) was recorded. aiortc:
  the microphone track's clip start + the last voiced sample's offset. Chromium: the fake
  microphone plays a WAV (silence, the question, silence); an AnalyserNode on the stream
  ``getUserMedia`` returned (a wrapper the bench injects; the bundle is unchanged) gives the
  last 10 ms louder than ``MIC_LOUD``: the speech's end as the page captured it (the WAV's
  timing from ``getUserMedia``'s resolve is kept beside it, ``wav_end_lag_ms``).

"Audible" is the first 20 ms of reply audio with an RMS above ``LOUD`` of full scale, when the
client would play it: the browser's AnalyserNode on what the page plays (as
tests/web/test_agents_sdk.py reads it, every 20 ms); aiortc: the arrival of the decoded frame;
Python WebSocket: each delta played from its arrival, after the one before (as a player
queues them), and the loud 20 ms's place in it.

Reported: every sample, the p50 and the max per client per measure, failures with their reason.
JSON (CPU model, ISA flags, profile, load, versions) goes to ``benchmarks/results/clients.json``.
``--quick``: 1 round per client (not for reporting). The suite runs it, not its ``--smoke``
(models and Chromium: minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from benchmarks import source_commit
from benchmarks.netns import isolate
from server.machine import this_machine

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from client.cli import ClientPeer
    from tests.support.server_process import ServerProcess
    from tests.web.test_agents_sdk import AppBackend

RESULT = Path(__file__).parent / "results" / "clients.json"
CLIENTS = ("openai_ws", "agents_webrtc", "agents_ws", "aiortc")
MEASURES = ("connect", "typed", "spoken")
DEFAULT_ROUNDS = 5
TYPED = "What is the capital of France?"
SPOKEN = "How many days are there in a week?"
INSTRUCTIONS = "You are the museum guide. Answer in one sentence."  # the Agents page's (app.js)
LOUD = 0.02  # RMS of full scale of 20 ms heard as reply audio (as tests/web/test_agents_sdk.py)
MIC_LOUD = 0.01  # RMS of full scale of 10 ms of the page's microphone heard as speech
VOICED = 500  # |sample| (int16) above this is speech
PIECE_MS = 40  # the Python WebSocket client's append
WS_RATE = 24_000  # Hz, PCM16 of /v1/realtime
MEDIA_RATE = 48_000  # Hz, WebRTC audio and the questions
LEAD_MS = 2500  # microphone silence before the question (Chromium: the SDK connects meanwhile)
WAIT_S = 90.0  # longest wait for one reply (s)
QUIET_S = 0.6  # a reply has played out once this long was quiet (s)
FAILS_TO_GIVE_UP = 2  # a client failing this many rounds is not asked again

T = TypeVar("T")


# ---------------------------------------------------------------- figures (pure)


def rms(pcm: npt.NDArray[np.int16]) -> float:
    """RMS of int16 samples as a share of full scale (0 for none)."""
    if not len(pcm):
        return 0.0
    return float(np.sqrt(np.mean((pcm.astype(np.float64) / 32768.0) ** 2)))


def last_voiced_s(clip: npt.NDArray[np.int16], rate: int) -> float:
    """Where the last voiced sample of ``clip`` ends, s from its start (0 without one)."""
    loud = np.flatnonzero(np.abs(clip.astype(np.int32)) > VOICED)
    return (int(loud[-1]) + 1) / rate if loud.size else 0.0


def first_loud_frame(
    frames: list[tuple[float, npt.NDArray[np.int16]]], after: float, level: float = LOUD
) -> float | None:
    """When the first frame (arrival s, samples) arriving after ``after`` was louder than
    ``level``; None if none was."""
    return next((t for t, pcm in frames if t > after and rms(pcm) > level), None)


@dataclass
class Playout:
    """Audio deltas played as a client queues them: each from its arrival or the end of the one
    before, whichever is later. ``chunks``: (play start s, samples at ``rate``)."""

    rate: int = WS_RATE
    chunks: list[tuple[float, npt.NDArray[np.int16]]] = field(default_factory=list)
    end: float = 0.0  # when the last queued sample has played (s)

    def add(self, arrival: float, pcm: npt.NDArray[np.int16]) -> None:
        start = max(arrival, self.end)
        self.chunks.append((start, pcm))
        self.end = start + len(pcm) / self.rate

    def first_loud(self, after: float, level: float = LOUD, window_ms: int = 20) -> float | None:
        """When the first ``window_ms`` louder than ``level`` of a chunk queued after ``after``
        starts to play (s)."""
        step = self.rate * window_ms // 1000
        for start, pcm in self.chunks:
            if start < after:
                continue
            for i in range(0, len(pcm), step):
                if rms(pcm[i : i + step]) > level:
                    return start + i / self.rate
        return None


def speech_end(levels: list[list[float]], before: float, level: float = MIC_LOUD) -> float | None:
    """The time of the last microphone reading ([t, rms]) louder than ``level`` before
    ``before``; None if none was."""
    loud = [t for t, value in levels if t < before and value > level]
    return loud[-1] if loud else None


def summary(samples: list[float], failures: list[str]) -> dict[str, Any]:
    """p50 (median) and max of ``samples`` (ms), with them and the failures."""
    return {
        "n": len(samples),
        "p50_ms": round(statistics.median(samples), 1) if samples else None,
        "max_ms": round(max(samples), 1) if samples else None,
        "samples_ms": [round(s, 1) for s in samples],
        "failures": failures,
    }


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per client, per measure: :func:`summary` of its rounds (a round holds ``connect_ms``,
    ``typed_ms``, ``spoken_ms`` or an ``error``)."""
    out: dict[str, dict[str, Any]] = {}
    for client, done in rounds.items():
        failures = [r["error"] for r in done if "error" in r]
        out[client] = {
            m: summary([r[f"{m}_ms"] for r in done if r.get(f"{m}_ms") is not None], failures)
            for m in MEASURES
        }
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    """The figures as text: one line per client, p50 / max ms per measure."""

    def cell(figure: dict[str, Any]) -> str:
        if figure["p50_ms"] is None:
            return "-"
        return f"{figure['p50_ms']:.0f} / {figure['max_ms']:.0f}"

    head = f"{'client':<15}" + "".join(f"{m + ' p50/max ms':>22}" for m in MEASURES) + "   n"
    lines = [head]
    for client, figures in results.items():
        cells = "".join(f"{cell(figures[m]):>22}" for m in MEASURES)
        lines.append(f"{client:<15}{cells}   {figures['connect']['n']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- Python clients (asyncio)


def pcm24(pcm48: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    from server.pipeline.resample import resample

    return resample(pcm48, MEDIA_RATE, WS_RATE)


class SocketClient:
    """The ``openai`` package's realtime connection: its events (arrival s, event), the reply
    audio as played (:class:`Playout`), and a microphone sending 40 ms pieces at real time."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.playout = Playout()
        self._queue: list[npt.NDArray[np.int16]] = []
        self.clip_started: list[float] = []  # when each clip's first sample was "recorded"
        self._new = asyncio.Event()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._mic())]

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            while True:
                raw = await self.connection.recv_bytes()
                now = time.monotonic()
                event = json.loads(raw)
                if event["type"] == "response.output_audio.delta":
                    pcm = np.frombuffer(base64.b64decode(event.pop("delta")), "<i2")
                    self.playout.add(now, pcm.astype(np.int16))
                self.events.append((now, event))
                self._new.set()

    async def _mic(self) -> None:
        """A microphone: piece i (40 ms) is sent once recorded, at start + (i + 1) * 40 ms;
        queued clips first, silence otherwise."""
        step = WS_RATE * PIECE_MS // 1000
        started, i, pending = time.monotonic(), 0, np.zeros(0, np.int16)
        while True:
            if not len(pending) and self._queue:
                pending = self._queue.pop(0)
                self.clip_started.append(started + i * PIECE_MS / 1000)
            piece = pending[:step]
            pending = pending[step:]
            if len(piece) < step:
                piece = np.concatenate([piece, np.zeros(step - len(piece), np.int16)])
            await asyncio.sleep(max(0.0, started + (i + 1) * PIECE_MS / 1000 - time.monotonic()))
            audio = base64.b64encode(piece.astype("<i2").tobytes()).decode()
            await self.connection.input_audio_buffer.append(audio=audio)
            i += 1

    def play(self, pcm: npt.NDArray[np.int16]) -> int:
        """Queue a clip (24 kHz); its index in ``clip_started``."""
        self._queue.append(pcm)
        return len(self.clip_started)

    async def wait(self, kind: str, after: int) -> float:
        """Arrival of the first ``kind`` event at index >= ``after`` (TimeoutError after
        WAIT_S)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            found = next((t for t, e in self.events[after:] if e["type"] == kind), None)
            if found is not None:
                return found
            self._new.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                seen = sorted({e["type"] for _, e in self.events})
                raise TimeoutError(f"no {kind} within {WAIT_S} s; saw {seen}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    async def played_out(self, after: int) -> None:
        """Wait for ``response.done`` and the queued audio's end."""
        await self.wait("response.done", after)
        while time.monotonic() < self.playout.end + QUIET_S:
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def openai_ws_round(url: str, token: str, question: npt.NDArray[np.int16]) -> dict[str, Any]:
    """One round of the ``openai`` package's client on ``GET /v1/realtime``."""
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    clip = np.concatenate([np.zeros(WS_RATE * 300 // 1000, np.int16), pcm24(question)])
    began = time.monotonic()
    async with api.realtime.connect(model="gpt-realtime") as connection:
        client = SocketClient(connection)
        try:
            created = await client.wait("session.created", 0)
            out: dict[str, Any] = {"connect_ms": (created - began) * 1000}
            n = len(client.events)
            session: Any = {"type": "realtime", "instructions": INSTRUCTIONS}
            await connection.session.update(session=session)
            await client.wait("session.updated", n)
            # spoken
            n = len(client.events)
            index = client.play(clip)
            await client.wait("response.created", n)
            ended = client.clip_started[index] + last_voiced_s(clip, WS_RATE)
            await client.played_out(n)
            heard = client.playout.first_loud(ended)
            out["spoken_ms"] = None if heard is None else (heard - ended) * 1000
            # typed
            n = len(client.events)
            sent = time.monotonic()
            content = [{"type": "input_text", "text": TYPED}]
            item: Any = {"type": "message", "role": "user", "content": content}
            await connection.conversation.item.create(item=item)
            await connection.response.create()
            await client.played_out(n)
            heard = client.playout.first_loud(sent)
            out["typed_ms"] = None if heard is None else (heard - sent) * 1000
            out["replies"] = [reply_text(client.events)]
            return out
        finally:
            await client.close()


def reply_text(events: list[tuple[float, dict[str, Any]]]) -> str:
    """The assistant's words in ``response.output_audio_transcript.delta`` events."""
    return "".join(
        e.get("delta", "")
        for _, e in events
        if e["type"] == "response.output_audio_transcript.delta"
    )


def calls_peer(url: str, token: str) -> ClientPeer:
    """A ``ClientPeer`` that calls ``POST /v1/realtime/calls`` with a server token, on the GA
    events channel, receiving audio and video; it hangs up with the token."""
    import aiohttp
    from aiortc import RTCSessionDescription

    from client.cli import GA_EVENTS, ClientPeer

    class CallsPeer(ClientPeer):
        async def connect(self, timeout: float = 15.0, resume_token: str | None = None) -> None:
            self.pc.addTrack(self.mic)
            self.pc.addTransceiver("video", direction="recvonly")
            await self.pc.setLocalDescription(await self.pc.createOffer())
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/sdp"}
            async with aiohttp.ClientSession() as http:
                self.posted_at = time.monotonic()
                async with http.post(
                    f"{self.base_url}/v1/realtime/calls",
                    data=self.pc.localDescription.sdp,
                    headers=headers,
                ) as resp:
                    if resp.status != 201:
                        raise RuntimeError(f"calls {resp.status}: {await resp.text()}")
                    self.location = resp.headers["Location"]
                    answer = await resp.text()
            self.session_id = self.location.rsplit("/", 1)[-1]
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await asyncio.wait_for(self.channel_open.wait(), timeout)

        async def close(self, delete: bool = True) -> None:
            if delete and self.location:
                with contextlib.suppress(aiohttp.ClientError):
                    async with (
                        aiohttp.ClientSession() as http,
                        http.delete(
                            self.base_url + self.location,
                            headers={"Authorization": f"Bearer {token}"},
                        ) as resp,
                    ):
                        await resp.read()
            await super().close(delete=False)

    return CallsPeer(url, video=True, events_label=GA_EVENTS)


async def aiortc_played_out(peer: ClientPeer, after: int) -> None:
    """Wait for ``response.done``, then until the last QUIET_S of received audio is quiet."""
    await peer.wait_event("response.done", timeout=WAIT_S, after=after)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        recent = [pcm for t, pcm in peer.audio[-100:] if t > time.monotonic() - QUIET_S]
        if recent and all(rms(pcm) <= LOUD for pcm in recent):
            return
        await asyncio.sleep(0.05)


async def aiortc_round(url: str, token: str, question: npt.NDArray[np.int16]) -> dict[str, Any]:
    """One round of aiortc on ``POST /v1/realtime/calls``, audio and video."""
    peer = calls_peer(url, token)
    try:
        began = time.monotonic()
        await peer.connect(timeout=30)
        await peer.wait_event("session.created", timeout=30)
        created = next(t for t, e in peer.events if e.get("type") == "session.created")
        out: dict[str, Any] = {"connect_ms": (created - began) * 1000}
        n = len(peer.events)
        peer.send({"type": "session.update", "session": {"type": "realtime",
                   "instructions": INSTRUCTIONS}})  # fmt: skip
        await peer.wait_event("session.updated", timeout=10, after=n)
        # spoken
        n = len(peer.events)
        clip = np.concatenate([np.zeros(MEDIA_RATE * 300 // 1000, np.int16), question])
        index = len(peer.mic.clip_sent_at)
        peer.mic.play(clip)
        await peer.wait_event("response.created", timeout=WAIT_S, after=n)
        ended = peer.mic.clip_sent_at[index] + last_voiced_s(clip, MEDIA_RATE)
        await aiortc_played_out(peer, n)
        heard = first_loud_frame(peer.audio, ended)
        out["spoken_ms"] = None if heard is None else (heard - ended) * 1000
        # typed
        n = len(peer.events)
        sent = time.monotonic()
        peer.say(TYPED)
        await aiortc_played_out(peer, n)
        heard = first_loud_frame(peer.audio, sent)
        out["typed_ms"] = None if heard is None else (heard - sent) * 1000
        out["video_frames"] = peer.video_count
        out["replies"] = [reply_text(peer.events[n:])]
        return out
    finally:
        await peer.close()


# ---------------------------------------------------------------- Chromium (sync playwright)

# Wraps getUserMedia: an AnalyserNode on the microphone stream the page gets, RMS every 10 ms.
MIC_METER_JS = """
(() => {
  const md = navigator.mediaDevices;
  const original = md.getUserMedia.bind(md);
  window.__mic = { opened: null, levels: [] };
  md.getUserMedia = async (constraints) => {
    const stream = await original(constraints);
    window.__mic.opened = performance.now();
    if (stream.getAudioTracks().length) {
      const context = new AudioContext();
      await context.resume();
      const analyser = context.createAnalyser();
      analyser.fftSize = 512;
      context.createMediaStreamSource(stream).connect(analyser);
      const samples = new Float32Array(analyser.fftSize);
      setInterval(() => {
        analyser.getFloatTimeDomainData(samples);
        let sum = 0;
        for (const s of samples) sum += s * s;
        window.__mic.levels.push([performance.now(), Math.sqrt(sum / samples.length)]);
      }, 10);
    }
    return stream;
  };
})();
"""


def poll(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """``check()`` every 0.05 s until truthy; TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        time.sleep(0.05)


def page_events(page: Page, kind: str, after: float) -> list[float]:
    """Page times (ms) of the SDK's ``kind`` events after ``after``."""
    found: list[float] = page.evaluate(
        "([k, a]) => window.agents.state.events.filter(e => e.type === k && e.at > a)"
        ".map(e => e.at)",
        [kind, after],
    )
    return found


def page_levels(page: Page, after: float) -> list[list[float]]:
    """The page's output levels ([ms, rms]) after ``after``."""
    found: list[list[float]] = page.evaluate(
        "(a) => window.agents.state.levels.filter(l => l[0] > a)", after
    )
    return found


def page_played_out(page: Page, after: float) -> None:
    """Wait for ``response.done`` after ``after`` (page ms), then QUIET_S of quiet output."""
    poll(lambda: page_events(page, "response.done", after), WAIT_S, "response.done")

    def quiet() -> bool:
        levels = page_levels(page, after)
        if not levels:
            return False
        recent = [v for t, v in levels if t > levels[-1][0] - QUIET_S * 1000]
        return levels[-1][0] - levels[0][0] > QUIET_S * 1000 and all(v <= LOUD for v in recent)

    poll(quiet, WAIT_S, "the reply's end")


def first_heard(page: Page, after: float) -> float:
    """Page ms of the first output level louder than LOUD after ``after``."""
    return poll(
        lambda: next((t for t, v in page_levels(page, after) if v > LOUD), None),
        WAIT_S,
        "audible reply audio",
    )


def agents_round(
    server: ServerProcess, backend: AppBackend, transport: str, wav: Path, question_end_s: float
) -> dict[str, Any]:
    """One round of the Agents SDK page on ``transport`` in a Chromium of its own (its fake
    microphone plays ``wav`` from the capture's start)."""
    from playwright.sync_api import sync_playwright

    from tests.support.browser import launch
    from tests.web.test_agents_sdk import realtime_url

    with sync_playwright() as pw:
        browser = launch(pw, wav, loop=False)
        try:
            page = browser.new_page()
            page.add_init_script(MIC_METER_JS)
            page.goto(f"{backend.origin}/index.html")
            options = {"transport": transport, "url": realtime_url(server, transport)}
            connect_ms = page.evaluate("(o) => window.agents.start(o)", options)
            out: dict[str, Any] = {"connect_ms": float(connect_ms)}
            # spoken: the fake microphone's question
            created = poll(
                lambda: page_events(page, "response.created", 0), WAIT_S, "a spoken reply"
            )[0]
            page_played_out(page, 0)
            mic: dict[str, Any] = page.evaluate("() => window.__mic")
            ended = speech_end(mic["levels"], created)
            if ended is None:
                raise RuntimeError("the page's microphone heard no speech")
            out["spoken_ms"] = first_heard(page, ended) - ended
            if mic["opened"] is not None:  # the WAV's own timing, against the meter's
                out["wav_end_lag_ms"] = round(ended - (mic["opened"] + question_end_s * 1000), 1)
            # typed
            sent = float(page.evaluate("(t) => window.agents.send(t)", TYPED))
            out["typed_ms"] = first_heard(page, sent) - sent
            page_played_out(page, sent)
            out["replies"] = page.evaluate(
                "() => window.agents.state.history.filter(i => i.role === 'assistant')"
                ".map(i => i.content.map(c => c.transcript || '').join(' '))"
            )
            errors: list[str] = page.evaluate("() => window.agents.state.errors")
            if errors:
                out["sdk_errors"] = errors
            page.evaluate("() => window.session.close()")
            return out
        finally:
            browser.close()


# ---------------------------------------------------------------- the run


def in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` in a loop of its own thread (playwright's sync API holds this one's)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def wait_no_sessions(server: ServerProcess, timeout: float = 15.0) -> int:
    """Wait until the server holds no session; the sessions left after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        sessions = int(server.health().get("sessions", 0))
        if sessions == 0 or time.monotonic() > deadline:
            return sessions
        time.sleep(0.1)


def versions(browser_version: str | None) -> dict[str, Any]:
    """The versions of what ran."""
    found: dict[str, Any] = {"python": platform.python_version()}
    for package in (
        "openai",
        "aiortc",
        "playwright",
        "onnxruntime",
        "faster-whisper",
        "ctranslate2",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    sdk = Path("tests/web/agents_sdk/node_modules/@openai/agents-realtime/package.json")
    with contextlib.suppress(OSError, ValueError):
        found["@openai/agents-realtime"] = json.loads(sdk.read_text())["version"]
    found["chromium"] = browser_version
    return found


def run(rounds: int, clients: list[str]) -> dict[str, Any]:
    """Start the server, ask every client ``rounds`` rounds in turn; the results."""
    from benchmarks.voice_bench import synthesize_questions
    from client.cli import save_wav
    from server.rtc.settings import pin_host_addresses
    from tests.support.server_process import ServerProcess
    from tests.web.test_agents_sdk import BUNDLE, TOKEN, AppBackend

    os.environ.setdefault("TEST_PACE", "1")  # the waits here are this file's own
    pin_host_addresses(["127.0.0.1"])
    if any(c.startswith("agents") for c in clients) and not BUNDLE.exists():
        raise RuntimeError(f"{BUNDLE} is missing: run scripts/setup.sh (npm ci, esbuild)")
    (question,) = synthesize_questions([SPOKEN])
    backend = AppBackend()
    backend.thread.start()
    tmp = Path(tempfile.mkdtemp(prefix="clients-bench-"))
    wav = tmp / "question.wav"
    lead = np.zeros(MEDIA_RATE * LEAD_MS // 1000, np.int16)
    save_wav(wav, np.concatenate([lead, question, np.zeros(MEDIA_RATE * 60, np.int16)]))
    question_end_s = LEAD_MS / 1000 + last_voiced_s(question, MEDIA_RATE)
    server = ServerProcess(
        {"server.cors_origins": backend.origin},  # and ServerProcess's max_sessions 4
        env={"AVATAR_SERVER_AUTH_TOKENS": TOKEN},
    )
    load_before = os.getloadavg()
    started = time.monotonic()
    server.start(timeout=600)
    ready_s = round(time.monotonic() - started, 1)
    backend.server_url = server.url
    print(f"server ready in {ready_s} s", flush=True)
    done: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    try:
        health = server.health()
        for r in range(rounds):
            for client in clients:
                if sum("error" in x for x in done[client]) >= FAILS_TO_GIVE_UP:
                    continue
                began = time.monotonic()
                try:
                    if client == "openai_ws":
                        result = in_thread(openai_ws_round(server.url, TOKEN, question))
                    elif client == "aiortc":
                        result = in_thread(aiortc_round(server.url, TOKEN, question))
                    else:
                        transport = "webrtc" if client == "agents_webrtc" else "websocket"
                        result = agents_round(server, backend, transport, wav, question_end_s)
                except Exception as exc:  # a client that cannot be measured says why
                    result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                result["round"] = r + 1
                result["wall_s"] = round(time.monotonic() - began, 1)
                result["sessions_left"] = wait_no_sessions(server)
                done[client].append(result)
                shown = {k: (round(v) if isinstance(v, float) else v) for k, v in result.items()}
                print(f"round {r + 1} {client}: {shown}", flush=True)
        log = server.log()
    finally:
        code = server.stop()
        backend.httpd.shutdown()
        backend.httpd.server_close()
    return {
        "rounds": done,
        "results": summarize(done),
        "server_ready_s": ready_s,
        "server_exit_code": code,
        "calibration": health.get("calibration"),
        "llm_log": [line for line in log.splitlines() if "LLM" in line][:4],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def chromium_version() -> str | None:
    """Chromium's version (None where it cannot be run)."""
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(
            ["/usr/bin/chromium", "--version"], capture_output=True, text=True, timeout=20
        )
        return found.stdout.strip() or None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.clients_bench", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, help=f"rounds per client (default {DEFAULT_ROUNDS})")
    parser.add_argument("--quick", action="store_true", help="1 round per client")
    parser.add_argument(
        "--clients", default=",".join(CLIENTS), help=f"comma-separated, of {', '.join(CLIENTS)}"
    )
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON goes")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else DEFAULT_ROUNDS)
    clients = [c for c in args.clients.split(",") if c]
    if unknown := set(clients) - set(CLIENTS):
        parser.error(f"unknown clients {sorted(unknown)}")
    isolate("benchmarks.clients_bench", argv)
    machine = this_machine()
    print(f"machine: {machine.describe()}", flush=True)
    started = time.monotonic()
    results = run(rounds, clients)
    report = {
        "what": "each client against one server on the default models, loopback, at the client",
        "machine": machine.to_dict(),
        "profile": "slow (ISA capped)" if machine.isa_caps else "as is",
        "commit": source_commit(),
        "versions": versions(chromium_version()),
        "quick": args.quick,
        "rounds_per_client": rounds,
        "questions": {"typed": TYPED, "spoken": SPOKEN, "instructions": INSTRUCTIONS},
        "thresholds": {"loud_rms": LOUD, "mic_loud_rms": MIC_LOUD, "voiced_sample": VOICED},
        **results,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(f"machine: {machine.describe()}; load average before {results['load_average_before']}"
          f", after {results['load_average_after']}")  # fmt: skip
    print(table(results["results"]))
    for client, figures in results["results"].items():
        if figures["connect"]["failures"]:
            print(f"{client} failures: {figures['connect']['failures']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
