"""The end-of-turn benchmark's summary: what it counts as a cut-off and as a wait."""

from __future__ import annotations

from benchmarks.end_of_turn_bench import summarize


def complete(silence_ms: float | None) -> dict[str, object]:
    return {"kind": "complete", "m": {"silence_ms": silence_ms}}


def test_a_complete_utterance_ended_before_its_end_is_counted_not_taken_for_a_short_wait() -> None:
    rows = [complete(200.0), complete(240.0), complete(260.0), complete(-771.6), complete(None)]
    rows.append({"kind": "unfinished", "m": {"cut_off": True}})
    rows.append({"kind": "unfinished", "m": {"cut_off": False, "after_pause_ms": 40.0}})
    summary = summarize(rows, "m")
    assert summary["complete"] == 5
    assert summary["complete_ended_before_their_end"] == 1
    assert summary["complete_never_ended"] == 1
    assert summary["silence_p50_ms"] == 240.0  # of the three that ended after their speech
    assert summary["cut_off_at_the_pause"] == 1 and summary["cut_off_share"] == 0.5
    assert summary["ended_within_100_ms_after_the_pause"] == 1
