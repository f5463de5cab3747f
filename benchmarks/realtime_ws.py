"""OpenAI Realtime over a WebSocket (``GET /v1/realtime``), measured with the ``openai``
package's own client (``client.realtime.connect()``):

    .venv/bin/python -m benchmarks.realtime_ws [--count 5] [--quick] [--out PATH]

Against the server in this process (the real turn detector, webrtcvad + Silero, and the tone
reply pipeline of tests/support: no ASR, LLM or TTS models, so the figures are the transport's
and the turn detection's, not a model's), on loopback:

- ``connect_ms``: from ``connect()`` to ``session.created`` received;
- ``typed_first_audio_ms``: from sending ``response.create`` (after a ``conversation.item.
  create``) to the first ``response.output_audio.delta``;
- ``spoken_first_audio_ms``: from the last append of a spoken question (espeak-ng, PCM16 at
  24 kHz in 40 ms pieces at real time, then silence appended on) to the first audio delta of
  its reply: the end of turn (server VAD and the semantic wait) and the reply's first audio;
- ``barge_in_ms``: from the first append of speech over a reply's audio to
  ``input_audio_buffer.speech_started`` (the pause: the client stops its playback there).

Reported: every sample, the median (p50) and the max. JSON (machine, ISA flags, commit) goes to
``benchmarks/results/realtime_ws.json`` (``--out``). ``--quick``: 2 of each, not for reporting.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import source_commit
from benchmarks.netns import isolate
from server.config import Config
from server.machine import this_machine
from server.pipeline.resample import resample
from tests.support.in_process import running
from tests.support.speech import silence, speak
from tests.support.tone_pipeline import TonePipeline

RESULT = Path(__file__).parent / "results" / "realtime_ws.json"
DEFAULT_COUNT = 5
QUICK_COUNT = 2
PIECE_MS = 40
TOKEN = "bench-token-0123456789abcdef"
WAIT_S = 30.0


def pipeline(config: Config) -> TonePipeline:
    return TonePipeline(1500.0, 2)


def pcm24(pcm48: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    return resample(pcm48, 48_000, 24_000)


class Client:
    """One connection, its events as they come (type, arrival time)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._new = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                raw = await self.connection.recv_bytes()
                self.events.append((time.monotonic(), json.loads(raw)))
                self._new.set()
        except Exception:
            return

    async def wait(self, kind: str, after: int) -> tuple[float, dict[str, Any]]:
        deadline = time.monotonic() + WAIT_S
        while True:
            for at, event in self.events[after:]:
                if event["type"] == kind:
                    return at, event
            self._new.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind} within {WAIT_S} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)

    async def append(self, pcm: npt.NDArray[np.int16]) -> float:
        """Append at real time; the time the last piece was sent."""
        step, started, sent = 24 * PIECE_MS, time.monotonic(), 0.0
        for i, start in enumerate(range(0, len(pcm), step)):
            piece = base64.b64encode(pcm[start : start + step].astype("<i2").tobytes()).decode()
            await self.connection.input_audio_buffer.append(audio=piece)
            sent = time.monotonic()
            await asyncio.sleep(max(0.0, started + (i + 1) * PIECE_MS / 1000 - time.monotonic()))
        return sent

    async def typed(self, text: str) -> float:
        """Ask by text; ms from response.create to the first audio delta (after it is done)."""
        n = len(self.events)
        content = [{"type": "input_text", "text": text}]
        await self.connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": content}
        )
        asked = time.monotonic()
        await self.connection.response.create()
        first, _ = await self.wait("response.output_audio.delta", n)
        await self.wait("response.done", n)
        return (first - asked) * 1000

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "samples_ms": [round(s, 1) for s in samples],
        "p50_ms": round(statistics.median(samples), 1),
        "max_ms": round(max(samples), 1),
    }


async def measure(count: int) -> dict[str, Any]:
    from openai import AsyncOpenAI

    question = pcm24(np.concatenate([silence(200), speak("What time does the museum open?")]))
    interjection = pcm24(speak("Wait, stop please."))
    quiet = pcm24(silence(40))
    figures: dict[str, list[float]] = {
        "connect_ms": [],
        "typed_first_audio_ms": [],
        "spoken_first_audio_ms": [],
        "barge_in_ms": [],
    }
    async with running({"server.auth_tokens": TOKEN}, pipeline=pipeline) as (url, _):
        api = AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0)
        for _round in range(count):
            began = time.monotonic()
            async with api.realtime.connect(model="gpt-realtime") as connection:
                client = Client(connection)
                created, _ev = await client.wait("session.created", 0)
                figures["connect_ms"].append((created - began) * 1000)
                figures["typed_first_audio_ms"].append(await client.typed("When do you open?"))
                # spoken: the question, then silence on as a microphone sends it
                n = len(client.events)
                ended = await client.append(question)
                silent = asyncio.create_task(client.append(np.tile(quiet, 75)))  # 3 s
                first, _ev = await client.wait("response.output_audio.delta", n)
                figures["spoken_first_audio_ms"].append((first - ended) * 1000)
                await client.wait("response.done", n)
                await silent
                # barge-in: speech over the reply's audio
                n = len(client.events)
                await connection.conversation.item.create(
                    item={"type": "message", "role": "user", "content": [
                        {"type": "input_text", "text": "Tell me a story."}]}
                )  # fmt: skip
                await connection.response.create()
                await client.wait("response.output_audio.delta", n)
                await asyncio.sleep(0.6)
                m = len(client.events)
                speaking = time.monotonic()
                talking = asyncio.create_task(client.append(interjection))
                heard, _ev = await client.wait("input_audio_buffer.speech_started", m)
                figures["barge_in_ms"].append((heard - speaking) * 1000)
                await talking
                await client.close()
            await asyncio.sleep(0.3)
    return {name: summary(samples) for name, samples in figures.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.realtime_ws", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--count", type=int, help=f"rounds (default {DEFAULT_COUNT})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} rounds")
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON goes")
    args = parser.parse_args(argv)
    count = args.count or (QUICK_COUNT if args.quick else DEFAULT_COUNT)
    isolate("benchmarks.realtime_ws", argv)
    print(f"machine: {this_machine().describe()}", flush=True)
    results = asyncio.run(measure(count))
    report = {
        "what": "GET /v1/realtime with the openai package's client, loopback, tone replies",
        "machine": this_machine().to_dict(),
        "commit": source_commit(),
        "quick": args.quick,
        "count": count,
        "results": results,
    }
    for name, figure in results.items():
        print(f"{name:24s} p50 {figure['p50_ms']:7.1f} ms  max {figure['max_ms']:7.1f} ms  "
              f"samples {figure['samples_ms']}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
