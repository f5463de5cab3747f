"""The inbound jitter benchmark: its scenarios, and a quick run that must pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.jitter_bench import main, scenarios
from benchmarks.netns import MARK


def test_the_scenarios_lose_and_reorder_what_they_say() -> None:
    made = scenarios(100)
    assert not any(made["none"][0](n) for n in range(1, 200)) and not made["none"][1]
    assert [n for n in range(1, 200) if made["one_lost"][0](n)] == [40]
    lost = sum(made["random_2pc"][0](n) for n in range(1, 200))
    assert 0 < lost < 12  # about 2 % of 200
    assert sorted(made["reordered"][1]) == [50, 100, 150]


def test_a_quick_run_writes_each_buffer_and_the_loss_holds_only_aiortcs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARK, "1")  # the test already runs in its own network namespace
    out = tmp_path / "jitter.json"
    assert main(["--quick", "--out", str(out)]) == 0
    found = json.loads(out.read_text())["scenarios"]
    assert set(found) == {"none", "one_lost", "random_2pc", "reordered"}
    lost = found["one_lost"]
    # aiortc's buffer holds the rest of the call back after a loss (about 280 ms); the
    # server's holds nothing, whatever the machine's speed
    assert lost["aiortc"]["delay_ms_p50"] > lost["arrival"]["delay_ms_p50"] + 150
    assert lost["arrival"]["silence_filled_ms"] == 0.0
    assert lost["arrival"]["concealed_ms"] == 20.0
