"""The benchmark suite: ``python -m benchmarks [--smoke]``.

Runs the scheduler simulation, the transport benchmarks (real server, real peers, own network
namespace), the voice benchmark (embedded models), the speech synthesiser and the LLM engine on
their own, the prefix-cache probe and the avatar benchmarks
(render cost, A/V offset, CPU of a speaking avatar), the attacks of SECURITY.md (sessions held open,
a STUN spray, a peer that acknowledges nothing), the prefill ablation and the WHIP connect times
(aiortc and GStreamer), the resume time after a lost connection, the user talking over the
avatar's echo (offline) and, not in ``--smoke``, each client's connect and first reply audio
(benchmarks/clients_bench.py: Chromium and the models), prints a summary table and
writes ``benchmarks/results/suite.json``. ``--smoke`` runs each for a few seconds (CI uses it so the
benchmarks cannot rot) and writes to ``benchmarks/results/smoke/``: its figures are not for
reporting. The figures BENCHMARKS.md quotes are committed in ``benchmarks/reported/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import (
    admission_bench,
    asr_bench,
    attacks,
    avatar_bench,
    avatar_sync,
    cache_probe,
    clients_bench,
    inbound_bench,
    llm_bench,
    prefill_ablation,
    realtime_bench,
    resume_bench,
    scheduler_sim,
    session_budget,
    stamped,
    talk_over_bench,
    transport_bench,
    tts_bench,
    unacked_peer,
    voice_bench,
    whip_connect,
    words_bench,
    workers_bench,
)
from benchmarks.netns import isolate

RESULTS = Path("benchmarks/results")


def _load(folder: Path, name: str) -> dict[str, Any]:
    data = json.loads((folder / name).read_text())
    return data if isinstance(data, dict) else {"rows": data}


def summary(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(figure, value) rows of the headline numbers."""
    rows: list[tuple[str, str]] = []
    t = results["transport"]
    b = t["barge_in"]
    rows.append(
        (
            "barge-in, confirmed voice -> silent frame p50/p95 ms",
            f"{b['confirmed_p50_ms']} / {b['confirmed_p95_ms']}",
        )
    )
    rows.append(
        ("barge-in, gate onset -> silent frame p50/p95 ms", f"{b['p50_ms']} / {b['p95_ms']}")
    )
    rows.append(("false speech starts on noise", str(t["noise"]["total"])))
    for n in (1, 4):
        p = t[f"pacing_{n}"]
        rows.append(
            (f"audio frame lateness p99 ms, {n} session(s)", str(p["frame_lateness_p99_ms"]))
        )
        rows.append(
            (
                f"server CPU % of a core per session, {n} session(s)",
                str(p["cpu_percent_per_session"]),
            )
        )
    rows.append(("memory per session MB", str(t["memory"]["per_session_mb"])))
    tts = results["tts"]["onnx"]
    rows.append(
        (
            "TTS real-time factor p50, first chunk p50 ms",
            f"{tts['rtf_p50']}, {tts['first_chunk_ms_p50']}",
        )
    )
    llm = results["llm"]
    rows.append(
        (
            f"LLM ({llm['engine']}) warm first token p50 ms, decode tok/s",
            f"{llm['warm_ttft_ms_p50']}, {llm['decode_tokens_per_s_p50']}",
        )
    )
    rows.append(
        ("capacity: sessions with 0 underruns (tone replies)", str(t["capacity"]["sessions_clean"]))
    )
    v = results["voice"]
    for mode in ("incremental", "baseline"):
        v2v = v[mode]["voice_to_voice_ms"]
        rows.append((f"voice-to-voice p50/p95 ms ({mode})", f"{v2v['p50']} / {v2v['p95']}"))
    rows.append(("incremental / baseline p50", str(v["ratio_incremental_vs_baseline_p50"])))
    rows.append(("underruns, concurrent conversing sessions", str(v["concurrent"]["underruns"])))
    a = results["asr"]
    rows.append(
        (
            "ASR WER full 30 s window / audio window / streaming",
            f"{a['full']['wer']} / {a['audio']['wer']} / {a['streaming']['wer']}",
        )
    )
    rows.append(
        (
            "ASR call p50 ms, full / audio window",
            f"{a['full']['call_ms_p50']} / {a['audio']['call_ms_p50']}",
        )
    )
    c = results["cache_probe"]["salted"]
    rows.append(
        (
            "prefix-cache probe: cached tokens, right / wrong guess",
            f"{c['probe']['right_guess']['cached_tokens_median']}"
            f" / {c['probe']['wrong_guess']['cached_tokens_median']}",
        )
    )
    rows.append(
        (
            "prefix-cache probe: first token ms, right / wrong guess",
            f"{c['probe']['right_guess']['first_token_ms_median']}"
            f" / {c['probe']['wrong_guess']['first_token_ms_median']}",
        )
    )
    shared = results["cache_probe"]["shared"]["cost"]
    for part, label in (("second_turn", "second turn"), ("first_turn_long_persona", "new owner")):
        rows.append(
            (
                f"first token ms, {label}: shared / salted cache",
                f"{shared[part]['first_token_ms_median']}"
                f" / {c['cost'][part]['first_token_ms_median']}",
            )
        )
    for run in results["attacks"]["hold_slots"]["runs"]:
        rows.append(
            (
                f"sessions held open by {len(run['attackers'])} address(es): others admitted",
                f"{run['others_created']} of {results['attacks']['hold_slots']['others_count']}",
            )
        )
    for run in results["attacks"]["stun_spray"]["runs"]:
        rows.append(
            (
                f"STUN spray {run['patches']}x{run['per_patch']}, {run['client']} client",
                f"{run['stun_packets']} packets to {run['distinct_ports']} ports",
            )
        )
    rss = results["unacked_peer"]["rss_mb"]
    rows.append(("peer that acks nothing: RSS MB first / last", f"{rss[0][1]} / {rss[-1][1]}"))
    r = results["realtime"]
    for part in ("one_session", "two_sessions"):
        p = r[part]
        rows.append(
            (
                f"realtime {part}: v2v p50 ms server / client",
                f"{p['voice_to_voice_ms_p50']} / {p['client_voice_to_voice_ms_p50']}",
            )
        )
        rows.append(
            (
                f"realtime {part}: gap p99/max ms, loop lag p99 <= ms, underruns",
                f"{p['audio_gap_ms_p99']}/{p['audio_gap_ms_max']}, {p['loop_lag_ms_p99_at_most']},"
                f" {p['underruns']}",
            )
        )
    rows.append(("calibration predicted / measured v2v", str(r["predicted_vs_measured"])))
    render = results["avatar_render"]["summary"]
    rows.append(
        (
            "avatar render CPU ms/frame 512x512 p50/p95, drawn frames",
            f"{render['steady_drawn_cpu']['p50_ms']} / {render['steady_drawn_cpu']['p95_ms']}",
        )
    )
    rows.append(
        (
            "avatar render: cache hit p50 ms, hit rate, mean ms/frame",
            f"{render['steady_hit_cpu']['p50_ms']}, {render['frame_cache_hit_rate']},"
            f" {render['steady_cpu_mean_ms']}",
        )
    )
    sync = results["avatar_sync"]
    rows.append(
        (
            "A/V offset at the client p50 ms (+ = video later)",
            str(sync["av_offset"]["offset_p50_ms"]),
        )
    )
    rows.append(
        (
            "server CPU % of a core, speaking avatar session",
            str(sync["cpu_speaking_with_video"]["cpu_percent_of_core"]),
        )
    )
    workers = results["workers"].get("summary", {})
    if workers:
        rows.append(
            (
                "capacity, sessions with p99 lateness <= 5 ms, 1 / 2 workers",
                " / ".join(str(workers[k]["capacity_5ms_median"]) for k in sorted(workers)),
            )
        )
    sims = results["scheduler"]["rows"]
    policies = ("edf", "round_robin", "round_robin_aware")
    for load in sorted({r["overload"] for r in sims}):
        for key, label in (
            ("underruns", "underruns"),
            ("first_audio_misses", "first-audio misses"),
        ):
            totals = [
                sum(r[key] for r in sims if r["policy"] == p and r["overload"] == load)
                for p in policies
            ]
            rows.append(
                (
                    f"scheduler {label} EDF / plain RR / aware RR at {load}x",
                    " / ".join(str(t) for t in totals),
                )
            )
    ablation = results["prefill_ablation"]
    for mode in prefill_ablation.MODES:
        if mode in ablation:
            m = ablation[mode]
            rows.append(
                (
                    f"prefill ablation {mode}: cached tokens, v2v p50 ms",
                    f"{m['cached_tokens_p50']}, {m['voice_to_voice_ms']['p50']}",
                )
            )
    whip = results["whip_connect"]["results"]
    rows.append(
        (
            "WHIP connect median ms: aiortc full / trickle, gst full / trickle",
            " / ".join(
                str(whip[k]["median_ms"])
                for k in ("aiortc/full", "aiortc/trickle", "gstreamer/full", "gstreamer/trickle")
            ),
        )
    )
    resume = results["resume"]
    rows.append(
        ("resume POST -> first audio median/p95 ms", f"{resume['median_ms']} / {resume['p95_ms']}")
    )
    for client, figures in results.get("clients", {}).get("results", {}).items():
        rows.append(
            (
                f"{client}: connect / typed / spoken first audio p50 ms",
                " / ".join(str(figures[m]["p50_ms"]) for m in clients_bench.MEASURES),
            )
        )
    inbound = results["inbound"]["summary"]["rests"]
    rows.append(
        (
            "inbound audio path CPU us per 20 ms, avatar silent/talking",
            f"{inbound['cpu_us_per_20ms_avatar_silent']} / "
            f"{inbound['cpu_us_per_20ms_avatar_talking']}",
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="the benchmark suite")
    parser.add_argument("--smoke", action="store_true", help="a few seconds per benchmark")
    args = parser.parse_args(argv)
    isolate("benchmarks", argv)
    quick = ["--quick"] if args.smoke else []
    # a smoke run's figures are not for reporting: they go to a folder of their own
    out = RESULTS / "smoke" if args.smoke else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    codes = {
        "scheduler": scheduler_sim.main([*quick, "--out", str(out / "scheduler_sim.json")]),
        "transport": transport_bench.main([*quick, "--out", str(out / "transport.json")]),
        "voice": voice_bench.main([*quick, "--out", str(out / "voice.json")]),
        "asr": asr_bench.main([*quick, "--out", str(out / "asr.json")]),
        "words": words_bench.main([*quick, "--out", str(out / "words.json")]),
        "tts": tts_bench.main([*quick, "--out", str(out / "tts.json")]),
        "llm": llm_bench.main([*quick, "--out", str(out / "llm.json")]),
        "cache_probe": cache_probe.main([*quick, "--out", str(out / "cache_probe.json")]),
        "realtime": realtime_bench.main([*quick, "--out", str(out / "realtime.json")]),
        "avatar_render": avatar_bench.main(
            [*(["--smoke"] if args.smoke else []), "--out", str(out / "avatar.json")]
        ),
        "avatar_sync": avatar_sync.main([*quick, "--out", str(out / "avatar_sync.json")]),
        "workers": workers_bench.main(
            [*(["--smoke"] if args.smoke else []), "--out", str(out / "workers.json")]
        ),
        "attacks": attacks.main([*quick, "--out", str(out / "attacks.json")]),
        "unacked_peer": unacked_peer.main(
            [*(["--seconds", "10"] if args.smoke else []), "--out", str(out / "unacked_peer.json")]
        ),
        "prefill_ablation": prefill_ablation.main(
            [*quick, "--out", str(out / "prefill_ablation.json")]
        ),
        "whip_connect": whip_connect.main([*quick, "--out", str(out / "whip_connect.json")]),
        "resume": resume_bench.main([*quick, "--out", str(out / "resume.json")]),
        "admission": admission_bench.main([*quick, "--out", str(out / "admission.json")]),
        "session_budget": session_budget.main([*quick, "--out", str(out / "session_budget.json")]),
        "talk_over": talk_over_bench.main(
            [*(["--seeds", "1"] if args.smoke else []), "--out", str(out / "talk_over.json")]
        ),
        "inbound": inbound_bench.main(
            [*(["--repeats", "1"] if args.smoke else []), "--out", str(out / "inbound.json")]
        ),
    }
    if not args.smoke:  # Chromium and the models for minutes: not in CI's smoke run
        codes["clients"] = clients_bench.main(["--out", str(out / "clients.json")])
    results = {
        "scheduler": _load(out, "scheduler_sim.json"),
        "transport": _load(out, "transport.json"),
        "voice": _load(out, "voice.json"),
        "asr": _load(out, "asr.json"),
        "tts": _load(out, "tts.json"),
        "llm": _load(out, "llm.json"),
        "cache_probe": _load(out, "cache_probe.json"),
        "realtime": _load(out, "realtime.json"),
        "avatar_render": _load(out, "avatar.json"),
        "avatar_sync": _load(out, "avatar_sync.json"),
        "workers": _load(out, "workers.json") if (out / "workers.json").exists() else {},
        "attacks": _load(out, "attacks.json"),
        "unacked_peer": _load(out, "unacked_peer.json"),
        "prefill_ablation": _load(out, "prefill_ablation.json"),
        "whip_connect": _load(out, "whip_connect.json"),
        "resume": _load(out, "resume.json"),
        "talk_over": _load(out, "talk_over.json"),
        "inbound": _load(out, "inbound.json"),
        "session_budget": _load(out, "session_budget.json"),
        "clients": {} if args.smoke else _load(out, "clients.json"),
        "smoke": args.smoke,
        "wall_s": round(time.monotonic() - started, 1),
    }
    (out / "suite.json").write_text(json.dumps(stamped(results), indent=2))
    print()
    for name, value in summary(results):
        print(f"{name:<58} {value}")
    print(f"suite took {results['wall_s']} s; wrote {out / 'suite.json'}")
    failed = {name: code for name, code in codes.items() if code != 0}
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
