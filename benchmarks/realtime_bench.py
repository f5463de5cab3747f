"""Realtime on this machine: the goals of "a compute budget for every stage", measured on the
path users run (real models, 512x512 video on, a real WebRTC peer).

One server on the embedded models, default settings (the calibration chooses what is unset;
``transport.max_sessions`` is set to 4 so that the two-session part always fits):

1. **One session**, a peer receiving audio and video, asks spoken questions one at a time
   (Piper's voice on its microphone). Per reply:
   - voice-to-voice as the server measures it (end-of-turn decision -> first reply audio),
     with the stage times;
   - as the client measures it: the question's last voiced frame sent -> the reply's first
     audible frame received;
   - outbound audio while the reply plays: the gaps between audio frames arriving at the
     client, and each frame's lateness against its 20 ms slot (server histogram: p99, and
     the most, so that a gap the client saw can be told from one the server sent: two
     frames leave at most 20 ms + the most lateness apart);
   - the event loop's lag (server histogram) over the replies, p99 and the most.
2. **Two sessions** conversing at once (audio and video each): the same, plus underruns.
3. **Calibration**: the voice-to-voice the server predicted at start (``/healthz``) against
   the one-session median.
4. With ``--thread-cpu``: where the CPU of each reply's wait went. The server's threads are
   sampled every 20 ms (benchmarks/thread_cpu.py: 2-3 % of a core in this process), and each
   reply's stages (to the first token, to the first chunk's text, to its first speech) get
   the CPU ms of each role (the event loop, the LLM, the recogniser, the voice, the default
   executor's avatar and end-of-turn work, the media threads) and the cores used in all.

Histogram quantiles are the upper bound of the bucket that holds them (server/metrics.py).
The peers run in this process, on the same cores as the server: their VP8 decoding competes
with it, as a browser on the same laptop would.

Run: ``.venv/bin/python -m benchmarks.realtime_bench`` (``--quick``: 3 questions, 1 per session
in part 2). ``--slow-server`` runs the server in the slow profile (``scripts/slow.sh``: AVX-512
off, 0.5 CPUs, which reproduces a 2-core AVX2 machine's model timings) while the peers, as a
user's client would, run on the rest of the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import pct, source_commit
from benchmarks.end_of_turn_bench import COMPLETE
from benchmarks.netns import isolate
from benchmarks.thread_cpu import ThreadCpu, server_pid, stage_cpu, stage_cpu_p50
from benchmarks.voice_bench import QUESTIONS, synthesize_questions
from client.cli import ClientPeer
from server.config import LLM_ENGINES
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.lossy_audio import LossySender
from tests.support.server_process import ServerProcess, metric_value
from tests.support.speech import silence

SLOW = Path(__file__).resolve().parent.parent / "scripts" / "slow.sh"
SLOW_CPUS = 0.5  # scripts/slow.sh's default quota: Whisper's 30 s window at >= 1 s a call
VOICED = 500  # |sample| above this is speech (int16)
MEDIA_RATE_HZ = 48_000
LATENESS = "avatar_audio_frame_lateness_seconds"
LOOP_LAG = "avatar_event_loop_lag_seconds"


def histogram(text: str, name: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, count)`` of a Prometheus histogram (labels summed)."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            key, _, value = line.rpartition(" ")
            le = key.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return sorted(buckets.items())


def quantile_between(before: str, after: str, name: str, q: float) -> float | None:
    """The ``q`` quantile (upper bucket bound, s) of what ``name`` observed between two
    scrapes; None when it observed nothing."""
    old = dict(histogram(before, name))
    delta = [(le, count - old.get(le, 0.0)) for le, count in histogram(after, name)]
    total = delta[-1][1] if delta else 0.0
    if total <= 0:
        return None
    for le, count in delta:
        if count >= q * total:
            return le
    return float("inf")


def last_voiced_s(clip: npt.NDArray[np.int16]) -> float:
    """Where the last voiced sample of ``clip`` is (s from its start)."""
    loud = np.flatnonzero(np.abs(clip.astype(np.int32)) > VOICED)
    return (int(loud[-1]) + 1) / MEDIA_RATE_HZ if loud.size else 0.0


async def ask(peer: ClientPeer, audio: npt.NDArray[np.int16]) -> dict[str, Any]:
    """One spoken question and its reply, timed by the server and by the client."""
    mark, heard_from = len(peer.events), len(peer.audio)
    sent_before = len(peer.mic.clip_sent_at)
    clip = np.concatenate([silence(300), audio])
    peer.mic.play(clip)
    timings = await peer.wait_event("response.timings", timeout=120, after=mark)
    await peer.wait_event("response.done", timeout=120, after=mark)
    done_at = next(t for t, e in peer.events[mark:] if e.get("type") == "response.done")
    speech_end = peer.mic.clip_sent_at[sent_before] + last_voiced_s(clip)
    arrivals = [
        (t, int(np.abs(pcm.astype(np.int32)).max(initial=0)))
        for t, pcm in peer.audio[heard_from:]
        if t > speech_end
    ]
    first = next((t for t, peak in arrivals if peak > VOICED), None)
    during = [t for t, _ in arrivals if first is not None and first <= t <= done_at]
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(during)]

    def seen(kind: str) -> float | None:
        return next((t for t, e in peer.events[mark:] if e.get("type") == kind), None)

    # the client's figure in three parts: the end of the turn (its event received), the
    # server's reply up to its first audio sent (the event that says so), that audio's way
    committed, started = seen("input_audio_buffer.committed"), seen("output_audio_buffer.started")
    final = "conversation.item.input_audio_transcription.completed"
    finals = [e.get("transcript") for _, e in peer.events[mark:] if e.get("type") == final]
    return {
        **timings,
        "heard": finals[0] if finals else None,
        "client_voice_to_voice_ms": None if first is None else (first - speech_end) * 1000,
        "client_endpoint_ms": None if committed is None else (committed - speech_end) * 1000,
        "client_audio_way_ms": (
            None if first is None or started is None else (first - started) * 1000
        ),
        "gaps_ms": gaps,
        "endpoint_at": committed,
    }


def p50_of(turns: list[dict[str, Any]], key: str) -> float | None:
    values = [t[key] for t in turns if t.get(key) is not None]
    return round(statistics.median(values), 1) if values else None


def p95_of(turns: list[dict[str, Any]], key: str) -> float | None:
    values = [t[key] for t in turns if t.get(key) is not None]
    return round(pct(values, 0.95), 1) if values else None


def cpu_cores(before: str, after: str, name: str, wall_s: float) -> float | None:
    """The share of a core a CPU-seconds gauge of the server grew by between two scrapes
    ``wall_s`` apart (None where the server does not report it)."""
    if wall_s <= 0 or name not in after:
        return None
    return round((metric_value(after, name) - metric_value(before, name)) / wall_s, 3)


def summary(
    turns: list[dict[str, Any]], before: str, after: str, wall_s: float = 0.0
) -> dict[str, Any]:
    def p50(key: str) -> float | None:
        return p50_of(turns, key)

    gaps = [g for t in turns for g in t["gaps_ms"]]
    lateness = quantile_between(before, after, LATENESS, 0.99)
    lag = quantile_between(before, after, LOOP_LAG, 0.99)
    latest = quantile_between(before, after, LATENESS, 1.0)
    most_lag = quantile_between(before, after, LOOP_LAG, 1.0)
    return {
        "replies": len(turns),
        "voice_to_voice_ms_p50": p50("voice_to_voice_ms"),
        # the calibration predicts a reply begun at the endpoint: the others' median
        "voice_to_voice_ms_p50_not_early": p50_of(
            [t for t in turns if not t.get("early_reply")], "voice_to_voice_ms"
        ),
        "client_voice_to_voice_ms_p50": p50("client_voice_to_voice_ms"),
        "client_voice_to_voice_ms_p95": p95_of(turns, "client_voice_to_voice_ms"),
        "client_endpoint_ms_p50": p50("client_endpoint_ms"),
        "client_audio_way_ms_p50": p50("client_audio_way_ms"),
        "asr_final_ms_p50": p50("asr_final_ms"),
        "llm_first_token_ms_p50": p50("llm_first_token_ms"),
        "first_chunk_text_ms_p50": p50("first_chunk_text_ms"),
        "first_tts_ms_p50": p50("first_tts_ms"),
        "audio_gap_ms_p99": round(pct(gaps, 0.99), 1) if gaps else None,
        "audio_gap_ms_max": round(max(gaps), 1) if gaps else None,
        "audio_gaps_over_40ms": sum(g > 40 for g in gaps),
        "frame_lateness_ms_p99_at_most": None if lateness is None else lateness * 1000,
        "frame_lateness_ms_max_at_most": None if latest is None else latest * 1000,
        "loop_lag_ms_p99_at_most": None if lag is None else lag * 1000,
        "loop_lag_ms_max_at_most": None if most_lag is None else most_lag * 1000,
        "early_replies_played": sum(bool(t.get("early_reply")) for t in turns),
        "early_replies_dropped": dropped(after) - dropped(before),
        # pictures not drawn: of a time the video track woke past / idle ones repeated
        "video_frames_skipped_late": shed(before, after, "late_frame"),
        "video_frames_repeated_idle": shed(before, after, "frame"),
        # the server's event loop thread and whole process, as shares of one core
        "loop_cpu_cores": cpu_cores(before, after, "avatar_event_loop_cpu_seconds", wall_s),
        "process_cpu_cores": cpu_cores(before, after, "avatar_process_cpu_seconds", wall_s),
    }


def dropped(metrics: str) -> int:
    """Early replies (server/conversation/early.py) dropped so far."""
    return int(metric_value(metrics, "avatar_early_replies_total", 'outcome="dropped"'))


def underruns(metrics: str) -> int:
    return int(metric_value(metrics, "avatar_playback_underruns_total"))


def shed(before: str, after: str, kind: str) -> int:
    """Optional work of ``kind`` the server dropped between two scrapes
    (``avatar_work_shed_total``: partial, prefill, frame, late_frame)."""
    name, label = "avatar_work_shed_total", f'kind="{kind}"'
    return int(metric_value(after, name, label) - metric_value(before, name, label))


def lose_mic_packets(peer: ClientPeer, share: float, seed: int) -> None:
    """From now on ``share`` (0-1) of the peer's microphone packets are lost on the way, at
    random (``seed``): a phone on Wi-Fi, not loopback."""
    rng = random.Random(seed)
    for sender in peer.pc.getSenders():
        if sender.track is not None and sender.track.kind == "audio":
            LossySender(sender, lambda _n: rng.random() < share, frozenset())


async def conversing(
    server: ServerProcess,
    questions: list[list[npt.NDArray[np.int16]]],
    mic_loss: float = 0.0,
    cpu: ThreadCpu | None = None,
) -> dict[str, Any]:
    """One peer (audio and video) per list of questions, all connected first; then each asks
    its questions one at a time, the peers at the same time. Figures of the asking part.
    ``mic_loss``: the share of each peer's microphone packets lost (0-1); ``cpu``: the
    server's threads sampled, for the CPU each role spent in each stage of a reply (from the
    client's receipt of the endpoint's event: a few ms after the server's endpoint)."""
    peers = [ClientPeer(server.url, video=True) for _ in questions]
    try:
        for seed, peer in enumerate(peers):
            await peer.connect(timeout=60)
            if mic_loss:
                lose_mic_packets(peer, mic_loss, seed)
        await asyncio.sleep(1.0)  # media flowing both ways before the first question
        before = await asyncio.to_thread(server.metrics)
        started = time.monotonic()

        async def asks(peer: ClientPeer, mine: list[npt.NDArray[np.int16]]) -> list[Any]:
            return [await ask(peer, q) for q in mine]

        turns = await asyncio.gather(*(asks(p, q) for p, q in zip(peers, questions, strict=True)))
        after = await asyncio.to_thread(server.metrics)
        wall_s = time.monotonic() - started
    finally:
        for peer in peers:
            await peer.close()
    both = [t for mine in turns for t in mine]
    if cpu is not None:
        for t in both:
            if t["endpoint_at"] is not None:
                t["stage_cpu_ms"] = stage_cpu(cpu, t["endpoint_at"], t)
    hidden = ("gaps_ms", "endpoint_at")
    return {
        **summary(both, before, after, wall_s),
        "underruns": underruns(after) - underruns(before),
        **({} if cpu is None else {"stage_cpu_ms_p50": stage_cpu_p50(both)}),
        "turns": [{k: v for k, v in t.items() if k not in hidden} for t in both],
    }


QUESTION_SETS = {"everyday": QUESTIONS, "end-of-turn": COMPLETE}


async def run(
    quick: bool,
    slow_server: bool,
    engine: str = "auto",
    model: str = "",
    slow_cpus: float = SLOW_CPUS,
    question_set: str = "everyday",
    settings: dict[str, str] | None = None,
    server_log: Path | None = None,
    mic_loss: float = 0.0,
    thread_cpu: bool = False,
    count: int = 0,
) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    texts = QUESTION_SETS[question_set][: count or (3 if quick else 6)]
    questions = synthesize_questions(texts)
    server = ServerProcess(
        {
            "server.debug_endpoints": "true",
            "transport.connect_timeout_s": "60",
            "transport.max_sessions": "4",
            "pipeline.llm_engine": engine,
            "pipeline.llm_model": model,
            **(settings or {}),
        },
        wrapper=[str(SLOW), "--cpus", str(slow_cpus), "--"] if slow_server else None,
    ).start(timeout=400)
    cpu = None
    if thread_cpu:
        assert server.proc is not None
        pid = server_pid(server.proc.pid)
        if pid is None:
            raise RuntimeError("no server process to sample")
        cpu = ThreadCpu(pid).start()
    try:
        health = await asyncio.to_thread(server.health)
        results: dict[str, Any] = {
            "calibration": health.get("calibration"),
            "profile": (
                f"server in the slow profile (scripts/slow.sh, {slow_cpus:g} CPUs)"
                if slow_server
                else "as is"
            ),
            "llm_engine": engine,
            "llm_model": model or "default",
            "questions": question_set,
            "settings": settings or {},
            "llm_log": [line for line in server.log().splitlines() if "LLM" in line][:4],
        }
        results["mic_loss"] = mic_loss
        results["one_session"] = await conversing(server, [questions], mic_loss, cpu)
        print(
            "one session",
            json.dumps({k: v for k, v in results["one_session"].items() if k != "turns"}),
        )
        per = max(1, len(questions) // 3)  # each of the two sessions (quick: 1, else 2)
        halves = [questions[0:per], questions[per : 2 * per]]
        results["two_sessions"] = await conversing(server, halves, mic_loss, cpu)
        print(
            "two sessions",
            json.dumps({k: v for k, v in results["two_sessions"].items() if k != "turns"}),
        )
        results["log_settings"] = [
            line.split("calibration: ", 1)[1]
            for line in server.log().splitlines()
            if "calibration: " in line
        ]
    finally:
        if cpu is not None:
            cpu.stop()
        if server_log is not None:
            server_log.write_text(server.log())
        server.stop()
    predicted = (results["calibration"] or {}).get("predicted_voice_to_voice_ms")
    measured = results["one_session"]["voice_to_voice_ms_p50_not_early"]
    results["predicted_vs_measured"] = (
        round(predicted / measured, 2) if predicted and measured else None
    )
    # what the model ladder weighs (pipeline.latency_budget_ms): the reply as the client hears it
    heard = (results["calibration"] or {}).get("predicted_heard_ms")
    at_client = results["one_session"]["client_voice_to_voice_ms_p50"]
    results["predicted_vs_measured_at_client"] = (
        round(heard / at_client, 2) if heard and at_client else None
    )
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="realtime goals on this machine")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--slow-server",
        action="store_true",
        help="run the server (only) in the slow profile: AVX-512 off, 0.5 CPUs",
    )
    parser.add_argument(
        "--slow-cpus",
        type=float,
        default=SLOW_CPUS,
        help="the slow profile's CPU quota (scripts/slow.sh --cpus; default 0.5)",
    )
    parser.add_argument(
        "--engine", choices=LLM_ENGINES, default="auto", help="pipeline.llm_engine of the server"
    )
    parser.add_argument("--model", default="", help="pipeline.llm_model of the server")
    parser.add_argument(
        "--questions",
        choices=sorted(QUESTION_SETS),
        default="everyday",
        help="what the user asks: everyday questions (voice_bench), or the complete utterances"
        " of end_of_turn_bench, about half of which the end-of-turn model hears as unfinished",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=0,
        help="questions asked (one session asks them all, two sessions a third each;"
        " default 6, --quick 3; at most 12 everyday ones)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting (dotted name), e.g. pipeline.early_reply=false; repeatable",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/realtime.json"))
    parser.add_argument(
        "--server-log",
        type=Path,
        default=None,
        help="write the server's log here at the end (with --set server.log_level=DEBUG: "
        "every stage of every turn)",
    )
    parser.add_argument(
        "--mic-loss",
        type=float,
        default=0.0,
        help="the share (0-1) of each client's microphone packets lost at random, from the "
        "connection on (default 0: loopback loses nothing)",
    )
    parser.add_argument(
        "--thread-cpu",
        action="store_true",
        help="sample the server's threads: the CPU each role spent in each stage of a reply",
    )
    args = parser.parse_args(argv)
    if not 0.0 <= args.mic_loss < 1.0:
        parser.error("--mic-loss must be in [0, 1)")
    isolate("benchmarks.realtime_bench", argv)
    print(f"machine: {this_machine().describe()}")
    started = time.monotonic()
    if args.slow_cpus <= 0:
        parser.error("--slow-cpus must be > 0")
    if any("=" not in item for item in args.set):
        parser.error("--set takes NAME=VALUE")
    settings = dict(item.split("=", 1) for item in args.set)
    results = asyncio.run(
        run(
            args.quick,
            args.slow_server,
            args.engine,
            args.model,
            args.slow_cpus,
            args.questions,
            settings,
            args.server_log,
            args.mic_loss,
            args.thread_cpu,
            args.count,
        )
    )
    results["machine"] = this_machine().to_dict()
    results["commit"] = source_commit()
    results["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"predicted/measured voice-to-voice: {results['predicted_vs_measured']}")
    print(f"predicted/measured at the client: {results['predicted_vs_measured_at_client']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
