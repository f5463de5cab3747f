"""Avatar benchmarks against a real server with real aiortc peers on loopback.

- A/V offset at the receiver: how much later (ms) the mouth moves than the audio it speaks, by
  cross-correlating the mouth opening seen in the decoded video frames with the audio envelope,
  both on the client's arrival clock (no lip-sync correction applied, as a plain WebRTC client
  sees it). The replies are the tone pipeline's speech-like tones, whose loudness follows the
  phoneme slots the lip-sync animates.
- Server CPU of a speaking avatar session: process CPU seconds per media second while replies
  play, with video (rendering + VP8) and without (audio and events only); their difference is
  the avatar's cost.

Run: ``.venv/bin/python -m benchmarks.avatar_sync`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import pct, stamped
from benchmarks.netns import isolate
from benchmarks.transport_bench import cpu_seconds, keep_talking
from client.cli import ClientPeer
from models.avatar import ProceduralAvatar
from server.avatar.seam import FaceState, Viseme
from server.rtc.settings import pin_host_addresses
from tests.support.server_process import TONE_PIPELINE, ServerProcess
from tests.support.speech import rms

GRID_MS = 5.0
MAX_LAG_MS = 300.0
SIZE = 512


@functools.cache  # the same for every reply of an appearance
def mouth_reference(appearance: str) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int16]]:
    """The mouth region (where an open mouth differs from a closed one; the renderer is
    deterministic) and the closed-mouth picture."""
    renderer = ProceduralAvatar(SIZE, SIZE)
    closed = renderer.render(FaceState(appearance)).astype(np.int16)
    opened = renderer.render(FaceState(appearance, Viseme.AA, 1.0)).astype(np.int16)
    mask = np.abs(opened - closed).sum(axis=2) > 60
    grown = mask.copy()  # widened, so small head motion keeps the mouth inside
    for dy in (-4, 0, 4):
        for dx in (-4, 0, 4):
            grown |= np.roll(np.roll(mask, dy, axis=0), dx, axis=1)
    return grown, closed


def mouth_opening(
    frames: list[tuple[float, npt.NDArray[np.uint8]]],
    reference: tuple[npt.NDArray[np.bool_], npt.NDArray[np.int16]],
) -> Any:
    """Per frame: how far the mouth region is from the closed mouth (teeth and the dark inside
    both count)."""
    mask, closed = reference
    times = np.array([t for t, _ in frames])
    values = np.array([np.abs(f[mask].astype(np.int16) - closed[mask]).mean() for _, f in frames])
    return times, values


def envelope(peer: ClientPeer) -> tuple[Any, Any]:
    times = np.array([t for t, _ in peer.audio])
    values = np.array([rms(p) for _, p in peer.audio])
    return times, values


def best_lag_ms(a: tuple[Any, Any], v: tuple[Any, Any]) -> tuple[float, float]:
    """Lag (ms) that best aligns the video signal to the audio one (+ = video later), and the
    correlation there."""
    start = max(a[0][0], v[0][0])
    end = min(a[0][-1], v[0][-1])
    grid = np.arange(start, end, GRID_MS / 1000)
    audio = np.interp(grid, a[0], a[1])
    audio = (audio - audio.mean()) / (audio.std() or 1)
    best = (0.0, -2.0)
    for lag in np.arange(-MAX_LAG_MS, MAX_LAG_MS + GRID_MS, GRID_MS):
        video = np.interp(grid + lag / 1000, v[0], v[1])
        video = (video - video.mean()) / (video.std() or 1)
        r = float(np.mean(audio * video))
        if r > best[1]:
            best = (float(lag), r)
    return best


async def av_offset(server: ServerProcess, replies: int) -> dict[str, Any]:
    offsets, correlations = [], []
    created: dict[str, Any] = {}
    for i in range(replies):
        peer = ClientPeer(server.url)
        peer.keep_video_frames = 2000
        try:
            await peer.connect()
            created = await peer.wait_event("session.created")
            appearance = created["session"]["appearances"][i % 2]
            peer.send({"type": "session.update", "session": {"appearance": appearance}})
            await peer.wait_event("session.updated")
            n = len(peer.events)
            peer.send({"type": "conversation.item.create", "text": f"Reply number {i}"})
            await peer.wait_event("response.done", timeout=30, after=n)
            await asyncio.sleep(0.5)
            t0 = next(t for t, e in peer.events[n:] if e["type"] == "response.created")
            frames = [
                (t, np.asarray(f.to_ndarray(format="rgb24"), np.uint8))
                for t, f in peer.video_frames
                if t >= t0 - 0.2
            ]
            audio = envelope(peer)
            keep = audio[0] >= t0 - 0.2
            lag, r = best_lag_ms(
                (audio[0][keep], audio[1][keep]),
                mouth_opening(frames, mouth_reference(appearance)),
            )
            offsets.append(lag)
            correlations.append(round(r, 3))
        finally:
            await peer.close()
    return {
        "replies": replies,
        "offset_ms": offsets,
        "offset_p50_ms": pct(offsets, 0.5),
        "abs_offset_max_ms": max(abs(o) for o in offsets),
        "correlation": correlations,
        "goal_abs_ms": 40,
    }


async def speaking_cpu(server: ServerProcess, video: bool, seconds: float) -> dict[str, Any]:
    """CPU % of a core while one session's avatar speaks for ``seconds``."""
    assert server.proc is not None
    peer = ClientPeer(server.url, video=video)
    try:
        await peer.connect()
        await peer.wait_event("session.created")
        await asyncio.sleep(1.0)
        cpu0, t0 = cpu_seconds(server.proc.pid), time.monotonic()
        spoken = await keep_talking(peer, seconds)
        cpu1, t1 = cpu_seconds(server.proc.pid), time.monotonic()
        return {
            "video": video,
            "replies": spoken,
            "cpu_percent_of_core": round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
            "video_frames_received": peer.video_count,
        }
    finally:
        await peer.close()


async def run(quick: bool) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    server = ServerProcess(
        {"pipeline.factory": TONE_PIPELINE, "transport.max_sessions": "2"},
        env={"TONE_PIPELINE_MS": "1500", "TONE_PIPELINE_SENTENCES": "2"},
    ).start()
    deadline = time.monotonic() + 120
    while "avatar warmed up" not in server.log() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # measure the steady state, not the first sprites
    try:
        sync = await av_offset(server, 2 if quick else 6)
        seconds = 4.0 if quick else 15.0
        with_video = await speaking_cpu(server, True, seconds)
        without = await speaking_cpu(server, False, seconds)
    finally:
        server.stop()
    avatar_cost = round(with_video["cpu_percent_of_core"] - without["cpu_percent_of_core"], 1)
    return {
        "av_offset": sync,
        "cpu_speaking_with_video": with_video,
        "cpu_speaking_audio_only": without,
        "avatar_cpu_percent_of_core": avatar_cost,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="avatar A/V offset and CPU")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/avatar_sync.json")
    args = parser.parse_args(argv)
    isolate("benchmarks.avatar_sync", argv)
    results = asyncio.run(run(args.quick))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamped(results), indent=2))
    s = results["av_offset"]
    print(f"A/V offset (video later +) p50 {s['offset_p50_ms']} ms, all {s['offset_ms']}")
    print(f"  correlation at best lag {s['correlation']}")
    print(
        "server CPU, speaking avatar session: "
        f"{results['cpu_speaking_with_video']['cpu_percent_of_core']} % of a core with video, "
        f"{results['cpu_speaking_audio_only']['cpu_percent_of_core']} % audio only "
        f"(avatar {results['avatar_cpu_percent_of_core']} %)"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
