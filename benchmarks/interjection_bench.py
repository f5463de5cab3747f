"""Voice over a playing reply, on the path users run: real models, a real WebRTC peer.

One server on the embedded models (Whisper judges the words of short interjections; the LLM
and the joe voice make the replies). A peer asks a typed question, and while the spoken reply
plays its microphone sends one sound:

- **false interruptions** (20): synthetic coughs (6) and clicks (4), and backchannels spoken by
  espeak-ng (10: "Mm-hm.", "Yeah.", "Okay.", ...). Each should pause the reply and resume it
  from the exact sample where it paused: checked on the received audio (the frame that faded
  out and the frame that faded back in carry the same samples at the same place: their
  cross-correlation peaks at lag 0). History must then hold the whole reply (the server's
  debug view: the assistant turn not truncated, its text the reply's transcript).
- **real interruptions** (20, espeak-ng: "Wait, stop.", "Sorry, can I ask something else?",
  ...): each must stop the reply (``conversation.item.truncated``). The reaction as the client
  hears it: the sound's onset sent -> the first silent frame received.

Run: ``.venv/bin/python -m benchmarks.interjection_bench`` (``--quick``: 4 + 4 trials;
``--slow-server``: the server in the slow profile, scripts/slow.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import pct, stamped
from benchmarks.netns import isolate
from client.cli import ClientPeer
from server.rtc.settings import pin_host_addresses
from tests.support.server_process import ServerProcess, metric_value
from tests.support.speech import rms, speak, voiced_span_ms

PCM = npt.NDArray[np.int16]
RATE = 48_000
FRAME = 960
FADE = 240  # runtime.fade_ms (5 ms) at 48 kHz
QUIET_LEVEL = 300.0  # RMS below which the paused samples are too quiet to compare
SLOW = Path(__file__).resolve().parents[1] / "scripts" / "slow.sh"
QUESTIONS = [
    "Tell me a short story about a brave little dragon.",
    "Describe a walk through a quiet forest in autumn.",
    "Tell me about the history of the city of Rome.",
    "Describe the view from the top of a tall mountain.",
    "Tell me a story about a cat who learned to fly.",
]
BACKCHANNELS = [
    "Mm-hm.", "Yeah.", "Okay.", "Uh-huh.", "Right.", "I see.", "Yes.", "Sure.", "Mhm.", "Oh, okay.",
]  # fmt: skip
INTERRUPTIONS = [
    "Wait, stop.", "Sorry, can I ask something else?", "No, that is not what I meant.",
    "Hold on a second.", "Actually, tell me about Paris instead.", "Stop.", "Wait.",
    "Excuse me, I have a question.", "Let me stop you there.", "Can you say that again?",
    "Hang on, I need to go.", "What did you just say?", "No no, something else please.",
    "Please stop talking.", "One moment, please.", "I have a different question.",
    "Sorry to interrupt you.", "Could you speak more slowly?", "That is enough, thank you.",
    "Tell me about the weather instead.",
]  # fmt: skip


def cough(seed: int) -> PCM:
    """A cough: one or two bursts of band-limited noise with a sharp attack and a fast decay."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(0.6 * RATE))
    for burst in range(1 + seed % 2):
        n = int(rng.uniform(0.18, 0.3) * RATE)
        noise = rng.standard_normal(n)
        spectrum = np.fft.rfft(noise)
        freqs = np.fft.rfftfreq(n, 1 / RATE)
        spectrum[(freqs < 250) | (freqs > 3500)] = 0
        shaped = np.fft.irfft(spectrum, n)
        t = np.arange(n) / RATE
        envelope = np.minimum(1.0, t / 0.01) * np.exp(-t / rng.uniform(0.05, 0.09))
        start = int(burst * 0.22 * RATE)
        level = 0.35 if burst == 0 else 0.2
        out[start : start + n] += shaped / np.abs(shaped).max() * envelope * level
    pcm: PCM = (np.clip(out, -1, 1) * 32767).astype(np.int16)
    return pcm


def click(seed: int) -> PCM:
    """A click (a mouse, a key, a tap on the microphone): one or two 3 ms decaying bursts."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(0.3 * RATE))
    n = int(0.003 * RATE)
    for start_s in (0.0, 0.09)[: 1 + seed % 2]:
        start = int(start_s * RATE)
        out[start : start + n] += rng.standard_normal(n) * np.exp(-np.arange(n) / (n / 4)) * 0.4
    pcm: PCM = (np.clip(out, -1, 1) * 32767).astype(np.int16)
    return pcm


def sounds(rng: random.Random) -> list[tuple[str, str, PCM]]:
    """(kind, label, 48 kHz audio) of the 20 false and the 20 real interruptions, shuffled."""
    false = [("cough", f"cough {i}", cough(i)) for i in range(6)]
    false += [("click", f"click {i}", click(i)) for i in range(4)]
    false += [("backchannel", text, speak(text)) for text in BACKCHANNELS]
    real = [("interruption", text, speak(text)) for text in INTERRUPTIONS]
    trials = false + real
    rng.shuffle(trials)
    return trials


def onset_s(pcm: PCM) -> float:
    """Where the sound becomes audible in its clip (s)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 500)
    return float(loud[0]) / RATE if len(loud) else 0.0


def resume_check(audio: list[PCM], paused_at: int, resumed_at: int) -> dict[str, Any]:
    """Did the reply resume from the sample where it paused? From the received frames (frame
    i carries output samples [960 i, 960 (i + 1)), all delayed alike by the codec):

    ``paused_at`` and ``resumed_at`` (samples on the output timeline, from the events) are
    where the fade-out and the fade-in went out. The fade-out is a copy of the samples the
    fade-in plays again, at the same place in its frame: found at the end of the sound in the
    paused frame, it must match the resumed frame at lag 0. A resume that skipped or repeated
    n samples matches at lag -n or +n (searched within +-``FADE``; see :func:`resumed_exactly`).

    Returns ``lag`` (samples) and ``score`` (normalised correlation at that lag), or
    ``silent`` when the reply was silent where it paused (a gap between words)."""
    k, m = paused_at // FRAME, resumed_at // FRAME
    if m + 2 > len(audio):
        return {"missing": True}
    a = audio[k].astype(np.float64)
    loud = np.flatnonzero(np.abs(a) > 0.05 * max(1.0, float(np.abs(a).max())))
    if rms(audio[k]) < 30 or len(loud) == 0 or loud[-1] < FADE:
        return {"silent": True}
    end = int(loud[-1]) + 1
    ramp = np.linspace(1.0, 0.0, FADE, endpoint=False)  # the fade-out; the fade-in reversed
    middle = slice(FADE // 5, FADE * 4 // 5)  # where neither ramp is near 0
    heard = (a[end - FADE : end] / ramp)[middle]  # the paused samples, the fade undone
    if float(np.sqrt(np.mean(heard**2))) < QUIET_LEVEL:
        return {"silent": True}  # too quiet where it paused (a word's tail) to compare
    b = np.concatenate(audio[m - 1 : m + 2]).astype(np.float64)
    at = FRAME + end - FADE  # the same place in the resumed frame
    scores = {}
    for lag in range(-FADE, FADE + 1):
        again = (b[at + lag : at + lag + FADE] / ramp[::-1])[middle]
        denom = np.sqrt(np.sum(heard**2) * np.sum(again**2))
        scores[lag] = float(np.dot(heard, again) / denom) if denom > 0 else 0.0
    lag = max(scores, key=lambda x: scores[x])
    return {"lag": lag, "score": round(scores[lag], 3), "score_at_0": round(scores[0], 3)}


def resumed_exactly(check: dict[str, Any]) -> bool:
    """The resumed frame matches the paused one at lag 0: well (>= 0.7), and as well as at any
    lag within 0.05 (voiced speech repeats at its pitch period, so a lag of one period may
    match about as well: such a skip cannot be told from audio alone)."""
    if "score_at_0" not in check:
        return False
    return bool(check["score_at_0"] >= 0.7 and check["score_at_0"] >= check["score"] - 0.05)


def silence_reaction(
    audio: list[tuple[float, PCM]], onset: float, paused_at: float, frames: int = 4
) -> float | None:
    """The sound's onset (s, monotonic) -> the first frame of the silent run the reply paused
    or stopped in (the first run of ``frames`` silent frames that lasts past ``paused_at``, when
    the client learnt of the pause); None when that run began before the onset (the sound fell
    in a gap of the speech)."""
    run: list[float] = []
    for t, pcm in audio:
        if rms(pcm) < 50:
            run.append(t)
            continue
        if len(run) >= frames and run[-1] >= paused_at:
            break
        run = []
    if len(run) < frames or run[0] < onset:
        return None
    return round((run[0] - onset) * 1000, 1)


def server_reactions(server: ServerProcess) -> tuple[float, float]:
    """The server's barge-in reaction histogram so far: (sum in s, count)."""
    text = server.metrics()
    return (
        metric_value(text, "avatar_barge_in_reaction_seconds_sum"),
        metric_value(text, "avatar_barge_in_reaction_seconds_count"),
    )


async def idle(server: ServerProcess, peer: ClientPeer, timeout: float = 120.0) -> None:
    """Until the conversation listens again: a reply to the interjection itself (an
    interruption is a turn of its own) is cancelled."""
    deadline = time.monotonic() + timeout
    calm = 0
    while time.monotonic() < deadline and calm < 3:
        found = await asyncio.to_thread(server.session, peer.session_id)
        turn = (found or {}).get("turn")
        calm = calm + 1 if turn == "listening" else 0
        if turn in ("thinking", "agent_speaking", "paused"):
            peer.send({"type": "response.cancel"})
        await asyncio.sleep(0.3)


async def loud_now(peer: ClientPeer, timeout: float = 2.0) -> None:
    """Until the last three frames received were loud (at most ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(peer.audio) >= 3 and all(rms(p) > 1000 for _, p in peer.audio[-3:]):
            return
        await asyncio.sleep(0.01)


async def audible(peer: ClientPeer, after: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(rms(p) > 1000 for _, p in peer.audio[after:]):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the reply never became audible")


def events_after(peer: ClientPeer, mark: int, kind: str) -> list[dict[str, Any]]:
    return [e for _, e in peer.events[mark:] if e.get("type") == kind]


async def trial(
    server: ServerProcess, peer: ClientPeer, question: str, sound: PCM, rng: random.Random
) -> dict[str, Any] | None:
    """One question, one sound over its reply; None when the reply ended before the sound."""
    mark = len(peer.events)
    frames_at = len(peer.audio)
    peer.say(question)
    await peer.wait_event("response.audio_transcript.delta", timeout=120, after=mark)
    await audible(peer, frames_at)
    await asyncio.sleep(rng.uniform(0.4, 1.0))
    await loud_now(peer)  # so that the pause likely falls in speech, where it can be checked
    if events_after(peer, mark, "response.done"):
        return None
    clips, sent_after = len(peer.mic.clip_sent_at), len(peer.audio)
    before = await asyncio.to_thread(server_reactions, server)
    peer.mic.play(sound)
    done = await peer.wait_event("response.done", timeout=120, after=mark)
    after = await asyncio.to_thread(server_reactions, server)
    await asyncio.sleep(0.3)
    onset = peer.mic.clip_sent_at[clips] + onset_s(sound)
    paused = events_after(peer, mark, "output_audio_buffer.paused")
    resumed = events_after(peer, mark, "output_audio_buffer.resumed")
    truncated = events_after(peer, mark, "conversation.item.truncated")
    if not paused and not truncated and done.get("status") == "completed":
        # the reply may have ended before the sound reached the server
        last_audible = max((t for t, p in peer.audio[frames_at:] if rms(p) > 1000), default=0.0)
        if last_audible < onset:
            return None
    reaction = None
    said = [t for t, e in peer.events[mark:] if e.get("type") == "output_audio_buffer.paused"]
    counted = after[1] - before[1]  # the server's own figure for this sound, where it paused
    server_ms = round((after[0] - before[0]) / counted * 1000, 1) if counted == 1 else None
    if said or truncated:
        heard_at = said[0] if said else onset
        reaction = silence_reaction(peer.audio[sent_after:], onset, heard_at)
    deltas = " ".join(
        e.get("delta", "") for e in events_after(peer, mark, "response.audio_transcript.delta")
    )
    session = server.session(peer.session_id) or {}
    words = session.get("interjections", {}).get("words", [])
    hearing = session.get("interjections", {}).get("hearing_ms", [])
    assistant = [t for t in session.get("history", []) if t["role"] == "assistant"]
    last = assistant[-1] if assistant else {}
    whole = bool(last) and not last["truncated"] and last["text"].split() == deltas.split()
    check: dict[str, Any] | None = None
    if paused and resumed:
        paused_at = round(paused[0]["position_ms"] * RATE / 1000)
        resumed_at = paused_at + round(resumed[0]["paused_ms"] * RATE / 1000)
        check = resume_check([p for _, p in peer.audio], paused_at, resumed_at)
    await idle(server, peer)
    return {
        "paused": bool(paused),
        "resumed": bool(resumed),
        "resume_reason": resumed[0].get("reason") if resumed else None,
        "paused_ms": resumed[0].get("paused_ms") if resumed else None,
        "interrupted": bool(truncated) or done.get("status") == "cancelled",
        "status": done.get("status"),
        "history_whole": whole,
        "resume_check": check,
        "client_reaction_ms": reaction,
        # stages: the server's own reaction (the first voiced frame's arrival -> the first
        # silent frame it sent), the rest (the onset's way in, the silent frame's way out and
        # the client's jitter buffer), and when the client was told of the pause (events)
        "server_reaction_ms": server_ms,
        "outside_server_ms": (
            round(reaction - server_ms, 1) if reaction is not None and server_ms else None
        ),
        "paused_event_ms": round((said[0] - onset) * 1000, 1) if said else None,
        "last_words_judged": words[-1] if words and (resumed or truncated) else None,
        "last_hearing_ms": hearing[-1] if hearing and (resumed or truncated) else None,
    }


async def run(
    quick: bool, slow_server: bool, settings: dict[str, str] | None = None, slow_cpus: float = 0.5
) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    rng = random.Random(7)
    plan = sounds(rng)
    if quick:
        plan = [t for t in plan if t[0] != "interruption"][:4] + [
            t for t in plan if t[0] == "interruption"
        ][:4]
    server = ServerProcess(
        {
            "server.debug_endpoints": "true",
            "transport.connect_timeout_s": "60",
            "transport.max_sessions": "2",
            "server.log_level": "INFO",
            **(settings or {}),
        },
        wrapper=[str(SLOW), "--cpus", str(slow_cpus), "--"] if slow_server else None,
    ).start(timeout=400)
    outcomes: list[dict[str, Any]] = []
    peer: ClientPeer | None = None
    try:
        for n, (kind, label, pcm) in enumerate(plan):
            if n % 5 == 0:  # a fresh conversation now and then: the prompt stays short
                if peer is not None:
                    await peer.close()
                peer = ClientPeer(server.url, video=True)
                await peer.connect(timeout=60)
            assert peer is not None
            for attempt in range(3):
                question = QUESTIONS[(n + attempt) % len(QUESTIONS)]
                found = await trial(server, peer, question, pcm, rng)
                if found is not None:
                    break
            else:
                found = {"skipped": "every reply ended before the sound"}
            found.update(kind=kind, label=label, onset_ms=round(voiced_span_ms(pcm)[0], 1))
            outcomes.append(found)
            print(json.dumps(found), flush=True)
    finally:
        if peer is not None:
            await peer.close()
        code = server.stop()
    found = summarize(outcomes, code, slow_server)
    found["profile"] = (
        f"server in the slow profile (scripts/slow.sh, {slow_cpus:g} CPUs)"
        if slow_server
        else "as is"
    )
    return found


def median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 1) if known else None


def summarize(outcomes: list[dict[str, Any]], code: int, slow_server: bool) -> dict[str, Any]:
    false = [o for o in outcomes if o["kind"] != "interruption" and "skipped" not in o]
    real = [o for o in outcomes if o["kind"] == "interruption" and "skipped" not in o]
    checks = [o["resume_check"] for o in false if o.get("resume_check")]
    exact = [c for c in checks if resumed_exactly(c)]
    kept = [o for o in false if not o["interrupted"] and o["history_whole"]]
    reactions = [o["client_reaction_ms"] for o in real if o.get("client_reaction_ms") is not None]
    pause_reactions = [
        o["client_reaction_ms"] for o in false if o.get("client_reaction_ms") is not None
    ]
    paused_ms = [o["paused_ms"] for o in false if o.get("paused_ms") is not None]
    hearings = [o["last_hearing_ms"] for o in outcomes if o.get("last_hearing_ms") is not None]
    return {
        "slow_server": slow_server,
        "false_interruptions": {
            "trials": len(false),
            "paused": sum(o["paused"] for o in false),
            "resumed": sum(bool(o["resumed"]) for o in false),
            "resume_checked_on_audio": len(checks) - sum("silent" in c for c in checks),
            "resume_at_the_paused_sample": len(exact),
            "resume_in_silence": sum("silent" in c for c in checks),
            "not_interrupted_history_whole": len(kept),
            "interrupted": sum(o["interrupted"] for o in false),
            "by_kind": {
                kind: {
                    "trials": sum(o["kind"] == kind for o in false),
                    "resumed": sum(o["kind"] == kind and bool(o["resumed"]) for o in false),
                    "interrupted": sum(o["kind"] == kind and o["interrupted"] for o in false),
                }
                for kind in ("cough", "click", "backchannel")
            },
            "pause_p50_ms": round(statistics.median(paused_ms), 1) if paused_ms else None,
            "client_pause_reaction_p50_ms": (
                round(statistics.median(pause_reactions), 1) if pause_reactions else None
            ),
        },
        "real_interruptions": {
            "trials": len(real),
            "stopped": sum(o["interrupted"] for o in real),
            "client_reaction_p50_ms": round(statistics.median(reactions), 1) if reactions else None,
            "client_reaction_p95_ms": round(pct(reactions, 0.95), 1) if reactions else None,
            "stages_p50_ms": {  # where the client's reaction goes (every sound that paused)
                stage: median_of([o.get(stage) for o in outcomes])
                for stage in ("server_reaction_ms", "outside_server_ms", "paused_event_ms")
            },
        },
        "interjection_hearing_ms": {  # the words of a pause's last hearing: asked -> heard
            "count": len(hearings),
            "p50": round(statistics.median(hearings), 1) if hearings else None,
            "max": max(hearings, default=None),
        },
        "skipped": sum("skipped" in o for o in outcomes),
        "trials": outcomes,
        "server_exit_code": code,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="false and real interruptions of a reply")
    parser.add_argument("--quick", action="store_true", help="4 + 4 trials")
    parser.add_argument("--slow-server", action="store_true", help="the server in slow.sh")
    parser.add_argument(
        "--slow-cpus",
        type=float,
        default=0.5,
        help="--slow-server's CPU quota (1: the ordinary profile; default 0.5: stress)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting (dotted name), e.g. pipeline.confine_to_quota=false; repeatable",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/interjection.json"))
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set takes NAME=VALUE")
    isolate("benchmarks.interjection_bench", argv)
    settings = dict(item.split("=", 1) for item in args.set)
    found = asyncio.run(run(args.quick, args.slow_server, settings, args.slow_cpus))
    results = {**found, "settings": settings}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "trials"}, indent=2))
    print(f"wrote {args.out}")
    return 0 if results["server_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
