"""Render cost of the procedural avatar on one thread, over a realistic face sequence.

The sequence is 10 s at 25 fps of one conversational turn: the user speaks (listening face,
a nod at the pause), the avatar thinks, then talks (a viseme every ~80 ms with loudness
weights ramped in over 30 ms, pauses between words), then idles. Blinks, head motion and gaze
come from the server's own ``FaceAnimator``. Every frame is a different face state; the
renderer's frame cache only hits where the quantised state really repeats.

For each appearance: the first frame of a fresh renderer (it draws the look's static layers),
the rest of the sequence with cold sprite caches (mouth and lid sprites drawn on first use),
the cost of ``warm()`` (drawing every sprite ahead), and the sequence on a warmed renderer
(steady state). Times are wall-clock and thread CPU ms per frame (CPU time is the cost on a
shared machine, where wall time also counts waiting for a core); "drawn" are the frames that
missed the frame cache and were composed. OpenCV is held to one thread.

Then the frames of the first look on their way out: converted to YUV 4:2:0 and VP8-encoded
as a live track does (``server.avatar.video.YuvConverter``, then the face's encoder,
``server.avatar.encoder.FaceEncoder``), against aiortc's encoder with a camera's settings, fed
YUV or the RGB frame to convert itself (libswscale's default, which starts and ends slice
threads for every frame); wall and process CPU ms per frame (every thread's) and the luma
PSNR of the pictures decoded, in turn.

Run: ``.venv/bin/python -m benchmarks.avatar_bench`` (``--smoke`` for a short run).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import cv2

from benchmarks import pct, stamped
from models.avatar import ProceduralAvatar
from server.avatar.face import FaceAnimator
from server.avatar.lipsync import LipSync, VisemeCue
from server.avatar.seam import Expression, FaceState, Viseme
from server.avatar.video import YuvConverter
from server.runtime.media import VIDEO_TIME_BASE, ms_to_samples

FPS = 25
FRAME_MS = 1000 / FPS
SPEECH_VISEMES = [v for v in Viseme if v is not Viseme.SIL]
VOWELS = [Viseme.AA, Viseme.E, Viseme.I, Viseme.O, Viseme.U]
# (until ms, expression): one turn
TIMELINE = (
    (2600.0, Expression.LISTENING),
    (3400.0, Expression.THINKING),
    (9300.0, Expression.SPEAKING),
    (1e12, Expression.IDLE),
)


def viseme_track(rng: random.Random, start_ms: float, end_ms: float) -> tuple[VisemeCue, ...]:
    """Cues of one reply (samples from the turn's start): consonant/vowel runs of ~80 ms, word
    pauses."""
    cues = []
    t = start_ms
    while t < end_ms:
        for i in range(rng.randint(2, 6)):  # one word
            viseme = rng.choice(VOWELS) if i % 2 else rng.choice(SPEECH_VISEMES)
            length = rng.uniform(50.0, 120.0)
            weight = round(rng.uniform(0.35, 1.0), 2)
            cues.append(VisemeCue(ms_to_samples(t), ms_to_samples(t + length), viseme, weight))
            t += length
        t += rng.uniform(60.0, 220.0) if rng.random() < 0.6 else 0.0
    return tuple(cues)


def sequence(appearance: str, seconds: float, seed: int = 1) -> list[FaceState]:
    """The face states of one turn, one per video frame (the timeline scaled to ``seconds``)."""
    rng = random.Random(seed)
    animator = FaceAnimator(seed)
    timeline = [(until * seconds / 10, e) for until, e in TIMELINE]
    lipsync = LipSync()  # the server's own cue lookup and attack ramp
    lipsync.add_chunk(0, 0, appearance, viseme_track(rng, timeline[1][0], timeline[2][0]))
    states = []
    for n in range(round(seconds * FPS)):
        t = n * FRAME_MS
        expression = next(e for until, e in timeline if t < until)
        if expression is Expression.LISTENING:
            animator.hear_user(t, 0.1 if t < timeline[0][0] - 400 else 0.0)
        viseme, weight = lipsync.at(0, ms_to_samples(t))
        states.append(animator.face(t, appearance, expression, viseme, weight))
    return states


def timed(
    renderer: ProceduralAvatar, states: list[FaceState]
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Wall and thread-CPU ms of each render, then the CPU ms of those that drew a frame and of
    those the whole-frame cache answered."""
    wall: list[float] = []
    cpu: list[float] = []
    drawn: list[float] = []
    hit: list[float] = []
    for state in states:
        misses = renderer.frames.misses
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        renderer.render(state)
        cpu.append((time.thread_time_ns() - c0) / 1e6)
        wall.append((time.perf_counter_ns() - w0) / 1e6)
        (drawn if renderer.frames.misses > misses else hit).append(cpu[-1])
    return wall, cpu, drawn, hit


def stats(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(values), 3),
        "p95_ms": round(pct(values, 0.95), 3),
        "max_ms": round(max(values), 3),
    }


def bench_look(appearance: str, size: tuple[int, int], seconds: float) -> dict[str, Any]:
    states = sequence(appearance, seconds)
    cold = ProceduralAvatar(*size)
    keys = {cold.quantise(s) for s in states}
    w0 = time.perf_counter_ns()
    cold.render(states[0])
    first_ms = (time.perf_counter_ns() - w0) / 1e6
    cold_wall, cold_cpu, cold_drawn, _ = timed(cold, states[1:])
    warm = ProceduralAvatar(*size)
    warm.render(states[0])
    w0 = time.perf_counter_ns()
    warm.warm(appearance)
    warm_ms = (time.perf_counter_ns() - w0) / 1e6
    hits0, misses0 = warm.frames.hits, warm.frames.misses
    steady_wall, steady_cpu, steady_drawn, steady_hit = timed(warm, states)
    hits, misses = warm.frames.hits - hits0, warm.frames.misses - misses0
    return {
        "frames": len(states),
        "distinct_states": len(keys),
        "first_frame_ms": round(first_ms, 1),
        "warm_ms": round(warm_ms, 1),
        "cold_sprites": {
            "wall": stats(cold_wall),
            "cpu": stats(cold_cpu),
            "drawn_cpu": stats(cold_drawn),
        },
        "steady": {
            "wall": stats(steady_wall),
            "cpu": stats(steady_cpu),
            "drawn_cpu": stats(steady_drawn),
        },
        "frame_cache_hit_rate": round(hits / max(1, hits + misses), 3),
        "_steady_wall": steady_wall,
        "_steady_cpu": steady_cpu,
        "_steady_drawn": steady_drawn,
        "_steady_hit": steady_hit,
    }


def encode_path(appearance: str, size: tuple[int, int], seconds: float) -> dict[str, Any]:
    """Conversion + VP8 encoding per frame (wall and process CPU ms) and the luma PSNR (dB) of
    the pictures as a receiver decodes them: the server's way (YUV from one thread, the face's
    encoder: server/avatar/encoder.py), YUV into aiortc's encoder (a camera's settings), and
    aiortc's way (RGB converted inside its encoder), alternating in blocks of 25 frames over
    the same rendered frames."""
    import av
    import numpy as np
    from aiortc.codecs.vpx import Vp8Decoder, Vp8Encoder, vp8_depayload
    from aiortc.jitterbuffer import JitterFrame

    from server.avatar.encoder import FaceEncoder

    renderer = ProceduralAvatar(*size)
    frames = [renderer.render(s) for s in sequence(appearance, seconds)]
    ways: dict[str, tuple[Any, YuvConverter | None, list[float], list[float], list[float]]] = {
        "server_yuv_face_encoder": (FaceEncoder(), YuvConverter(), [], [], []),
        "yuv_camera_encoder": (Vp8Encoder(), YuvConverter(), [], [], []),
        "rgb_camera_encoder": (Vp8Encoder(), None, [], [], []),
    }
    decoders = {way: Vp8Decoder() for way in ways}
    reference = YuvConverter()
    lumas = [reference(rgb)[: size[1]].astype(np.float64) for rgb in frames]  # once, for all
    for block in range(0, len(frames), FPS):
        for way, (encoder, to_yuv, wall, cpu, psnr) in ways.items():
            for i in range(block, min(block + FPS, len(frames))):
                w0, c0 = time.perf_counter_ns(), time.process_time_ns()
                if to_yuv is None:
                    frame = av.VideoFrame.from_ndarray(frames[i], format="rgb24")
                else:
                    frame = av.VideoFrame.from_ndarray(to_yuv(frames[i]), format="yuv420p")
                frame.pts, frame.time_base = i * int(1 / (FPS * VIDEO_TIME_BASE)), VIDEO_TIME_BASE
                payloads, timestamp = encoder.encode(frame)
                cpu.append((time.process_time_ns() - c0) / 1e6)
                wall.append((time.perf_counter_ns() - w0) / 1e6)
                data = b"".join(vp8_depayload(p) for p in payloads)
                for out in decoders[way].decode(JitterFrame(data=data, timestamp=timestamp)):
                    assert isinstance(out, av.VideoFrame)
                    got = out.to_ndarray(format="yuv420p")[: size[1]].astype(np.float64)
                    error = max(float(np.mean((got - lumas[i]) ** 2)), 1e-9)
                    psnr.append(10 * math.log10(255**2 / error))
    return {
        way: {
            "wall": stats(wall),
            "cpu": stats(cpu),
            "cpu_mean_ms": round(statistics.fmean(cpu), 3),
            "luma_psnr_db_p50": round(statistics.median(psnr), 2),
        }
        for way, (_, _, wall, cpu, psnr) in ways.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="2 s of one look (not for reporting)")
    parser.add_argument("--size", default="512x512", help="WIDTHxHEIGHT")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/avatar.json"))
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)
    size = tuple(int(n) for n in args.size.lower().split("x"))
    assert len(size) == 2
    seconds = 2.0 if args.smoke else 10.0
    looks = ProceduralAvatar(*size).appearances
    looks = looks[:1] if args.smoke else looks
    results: dict[str, Any] = {}
    print(f"avatar render, {size[0]}x{size[1]}, {seconds:g} s at {FPS} fps, one thread")
    header = (
        f"{'look':<6} {'phase':<13} {'wall p50':>8} {'p95':>7} {'max':>7} {'cpu p50':>8} {'p95':>7}"
        f" {'drawn cpu p50':>13} {'p95':>7}"
    )
    print(header)
    for look in looks:
        r = bench_look(look, (size[0], size[1]), seconds)
        results[look] = r
        for phase in ("cold_sprites", "steady"):
            w, c, d = r[phase]["wall"], r[phase]["cpu"], r[phase]["drawn_cpu"]
            print(
                f"{look:<6} {phase:<13} {w['p50_ms']:>8.2f} {w['p95_ms']:>7.2f} {w['max_ms']:>7.2f}"
                f" {c['p50_ms']:>8.2f} {c['p95_ms']:>7.2f} {d['p50_ms']:>13.2f} {d['p95_ms']:>7.2f}"
            )
        print(
            f"{look:<6} first frame {r['first_frame_ms']:.0f} ms, warm() {r['warm_ms']:.0f} ms,"
            f" {r['distinct_states']} distinct states in {r['frames']} frames,"
            f" frame cache hit rate {r['frame_cache_hit_rate']:.1%}"
        )
    wall = [v for r in results.values() for v in r.pop("_steady_wall")]
    cpu = [v for r in results.values() for v in r.pop("_steady_cpu")]
    drawn = [v for r in results.values() for v in r.pop("_steady_drawn")]
    hits = [v for r in results.values() for v in r.pop("_steady_hit")]
    # the per-frame CPU is two-peaked (whole-frame cache hits cost microseconds, drawn frames
    # most of a millisecond), so the summary gives each peak, the hit rate and the mean, not one
    # median of the mixture
    summary = {
        "steady_wall": stats(wall),
        "steady_cpu": stats(cpu),
        "steady_drawn_cpu": stats(drawn),
        "steady_hit_cpu": stats(hits or [0.0]),
        "steady_cpu_mean_ms": round(statistics.fmean(cpu), 3),
        "frame_cache_hit_rate": round(1 - len(drawn) / len(cpu), 3),
    }
    for name, figures in summary.items():
        if isinstance(figures, dict):
            print(
                f"all looks, {name}: p50 {figures['p50_ms']:.3f} ms, p95 {figures['p95_ms']:.3f} ms"
            )
    print(
        f"all looks: mean CPU {summary['steady_cpu_mean_ms']} ms a frame,"
        f" frame cache hit rate {summary['frame_cache_hit_rate']:.1%}"
    )
    encoded = encode_path(looks[0], (size[0], size[1]), seconds)
    for way, figures in encoded.items():
        w, c = figures["wall"], figures["cpu"]
        print(
            f"converted and VP8-encoded, {way}: wall p50 {w['p50_ms']:.2f} ms (p95"
            f" {w['p95_ms']:.2f}), process CPU p50 {c['p50_ms']:.2f} ms"
            f" (mean {figures['cpu_mean_ms']}), luma PSNR p50 {figures['luma_psnr_db_p50']} dB"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {
        "size": list(size),
        "seconds": seconds,
        "fps": FPS,
        "smoke": args.smoke,
        "looks": results,
        "summary": summary,
        "encoded": encoded,
    }
    args.out.write_text(json.dumps(stamped(out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
