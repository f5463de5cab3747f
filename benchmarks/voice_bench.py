"""Voice-to-voice latency on the embedded models, through a real server and a real peer.

For each spoken question (synthesized by the project's own TTS, sent as the peer's microphone)
the server reports, in its ``response.timings`` event, the time from its end-of-turn decision to
the first non-silent outbound audio frame, and the stage breakdown (final transcript, LLM first
token, first chunk of text, first TTS chunk). The same questions run twice in one run: with
incremental prefill/partial ASR on, and off; the ratio is computed within the run. A last step
runs several sessions conversing at once and counts playback underruns during replies.

Run: ``.venv/bin/python -m benchmarks.voice_bench`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import at_mic_level, pct, stamped
from benchmarks.netns import isolate
from benchmarks.transport_bench import session_stats
from client.cli import ClientPeer
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.server_process import ServerProcess
from tests.support.speech import silence

QUESTIONS = [
    "What is the capital of France?",
    "How many days are there in a week?",
    "What colour is the sky on a clear day?",
    "Can you recommend a good book to read?",
    "What is the weather usually like in summer?",
    "How do I make a cup of tea?",
    "What is your favourite animal?",
    "Why do leaves change colour in autumn?",
    "How far away is the moon?",
    "What should I cook for dinner tonight?",
    "Tell me a fun fact about the ocean.",
    "What time of day is best for a walk?",
]


def synthesize_questions(texts: list[str]) -> list[npt.NDArray[np.int16]]:
    """The questions in the joe voice, at a microphone's level (``at_mic_level``)."""
    from models.tts import OnnxVoiceTts

    tts = OnnxVoiceTts()
    return [at_mic_level(tts.synthesize(t).pcm) for t in texts]


async def ask(
    peer: ClientPeer, audio: npt.NDArray[np.int16], timeout: float = 60
) -> dict[str, Any]:
    mark = len(peer.events)
    peer.mic.play(np.concatenate([silence(300), audio]))
    timings = await peer.wait_event("response.timings", timeout=timeout, after=mark)
    await peer.wait_event("response.done", timeout=timeout, after=mark)
    transcript = await peer.wait_event(
        "conversation.item.input_audio_transcription.completed", timeout=1, after=mark
    )
    deltas = [
        e["delta"]
        for _, e in peer.events[mark:]
        if e.get("type") == "response.audio_transcript.delta"
    ]
    return {**timings, "heard": transcript["transcript"], "reply": " ".join(deltas)}


TURN_KEYS = (
    "voice_to_voice_ms",
    "asr_final_ms",
    "llm_first_token_ms",
    "first_chunk_text_ms",
    "first_tts_ms",
    "prompt_tokens",
    "cached_tokens",
    "prefill_cached_tokens",
)


def summarize(turns: list[dict[str, Any]]) -> dict[str, Any]:
    def stat(key: str) -> dict[str, float | None]:
        values = [t[key] for t in turns if t.get(key) is not None]
        if not values:
            return {"p50": None, "p95": None}
        return {"p50": round(statistics.median(values), 1), "p95": round(pct(values, 0.95), 1)}

    keys = (
        "voice_to_voice_ms",
        "asr_final_ms",
        "llm_first_token_ms",
        "first_chunk_text_ms",
        "first_tts_ms",
    )
    out: dict[str, Any] = {k: stat(k) for k in keys}
    out["cached_tokens_per_turn"] = [t.get("cached_tokens") for t in turns]
    out["prefill_cached_tokens_per_turn"] = [t.get("prefill_cached_tokens") for t in turns]
    out["turns"] = len(turns)
    return out


async def conversation(url: str, questions: list[npt.NDArray[np.int16]]) -> list[dict[str, Any]]:
    peer = ClientPeer(url, video=False)
    await peer.connect(timeout=30)
    try:
        return [await ask(peer, q) for q in questions]
    finally:
        await peer.close()


async def one_at_a_time(
    peer: ClientPeer, questions: list[npt.NDArray[np.int16]]
) -> list[dict[str, Any]]:
    """A peer asks its questions one after another, each once the previous reply has ended
    (two questions on one microphone at once would be heard as one utterance)."""
    return [await ask(peer, q, timeout=120) for q in questions]


async def concurrent(
    server: ServerProcess, sessions: int, questions: list[npt.NDArray[np.int16]]
) -> dict[str, Any]:
    """``sessions`` peers (audio and video) asking at the same instant: each asks two
    questions, one at a time; the sessions run simultaneously."""
    peers = [ClientPeer(server.url, video=True) for _ in range(sessions)]
    for peer in peers:
        await peer.connect(timeout=30)
    try:
        results = await asyncio.gather(
            *(one_at_a_time(p, questions[i::sessions][:2]) for i, p in enumerate(peers))
        )
        await asyncio.sleep(1)
        stats = [session_stats(server, p.session_id) for p in peers]
    finally:
        for peer in peers:
            await peer.close()
    v2v = [t["voice_to_voice_ms"] for r in results for t in r]
    # each question was heard as an utterance of its own, and answered once
    heard = [(p.session_id, t["heard"]) for p, r in zip(peers, results, strict=True) for t in r]
    assert len(set(heard)) == len(heard), f"two questions heard as one: {heard}"
    return {
        "sessions": sessions,
        "simultaneous": True,
        "questions_per_session": [len(r) for r in results],
        "replies": len(v2v),
        "underruns": sum(s["underruns"] for s in stats),
        "voice_to_voice_p50_ms": round(statistics.median(v2v), 1),
        "voice_to_voice_p95_ms": round(pct(v2v, 0.95), 1),
        "turns": [{k: t.get(k) for k in TURN_KEYS} for r in results for t in r],
    }


async def run(quick: bool) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    texts = QUESTIONS[:3] if quick else QUESTIONS[:10]
    questions = synthesize_questions(texts)
    results: dict[str, Any] = {"machine": this_machine().to_dict(), "questions": texts}
    for label, incremental in (("incremental", "true"), ("baseline", "false")):
        server = ServerProcess(
            {
                "pipeline.incremental": incremental,
                "server.debug_endpoints": "true",
                "transport.max_sessions": "8",
                "transport.connect_timeout_s": "60",
            }
        ).start(timeout=300)
        try:
            turns = await conversation(server.url, questions)
            results[label] = summarize(turns)
            results[label]["examples"] = [
                {"heard": t["heard"], "reply": t["reply"]} for t in turns[:3]
            ]
            print(label, json.dumps({k: v for k, v in results[label].items() if k != "examples"}))
            if label == "incremental":
                n = 2 if quick else 4
                results["concurrent"] = await concurrent(server, n, questions)
                print("concurrent", results["concurrent"])
        finally:
            server.stop()
    inc = results["incremental"]["voice_to_voice_ms"]["p50"]
    base = results["baseline"]["voice_to_voice_ms"]["p50"]
    results["ratio_incremental_vs_baseline_p50"] = round(inc / base, 2) if inc and base else None
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="voice-to-voice benchmark")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/voice.json"))
    args = parser.parse_args(argv)
    isolate("benchmarks.voice_bench", argv)
    print(f"machine: {this_machine().describe()}")
    started = time.monotonic()
    results = asyncio.run(run(args.quick))
    results["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2))
    print(f"ratio p50 incremental/baseline: {results['ratio_incremental_vs_baseline_p50']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
