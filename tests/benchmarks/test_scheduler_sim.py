"""The scheduler simulation is deterministic (simulated time): its outcomes can be asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scheduler_sim import Policy, cost_per_audio_ms, main, simulate


def test_offered_load_scales_with_sessions() -> None:
    assert cost_per_audio_ms(16, 2.0) == pytest.approx(2 * cost_per_audio_ms(16, 1.0))
    assert cost_per_audio_ms(8, 1.0) == pytest.approx(2 * cost_per_audio_ms(16, 1.0))


def test_edf_never_schedules_stale_work_and_misses_less_under_overload() -> None:
    edf = simulate(Policy.EDF, 8, 2.0, seed=1, duration_ms=60_000)
    plain = simulate(Policy.RR, 8, 2.0, seed=1, duration_ms=60_000)
    assert edf.barge_ins > 0 and plain.barge_ins > 0  # the scenario does exercise barge-in
    assert edf.stale_scheduled == 0 and edf.stale_compute_ms == 0
    assert plain.stale_scheduled > 0  # plain round-robin knows no epochs
    assert edf.underruns < plain.underruns
    assert edf.replies > 0 and plain.replies > 0


def test_quick_run_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    assert main(["--quick", "--out", str(out)]) == 0
    assert out.exists()
