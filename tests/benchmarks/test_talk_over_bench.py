"""The talk-over benchmark, one synthesis: the real canceller, gate and turn detector hear the
user over the avatar's echo, and the gate that learns the user as the echo learns a gain far
above the echo's (-10 dB)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.talk_over_bench import main


def test_one_seed_both_arms(tmp_path: Path) -> None:
    out = tmp_path / "talk_over.json"
    assert main(["--seeds", "1", "--ablate", "user-frames", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["machine"]["cores"] >= 1 and result["commit"]
    (row,) = result["rows"]
    gate, before = row["gate"], row["learns_user"]
    for arm in (gate, before):  # each talk-over is heard (a start within its words)
        assert all(start is not None for start in arm["starts_after_ms"])
    # over 10 seeds (the user at a microphone's level, the reply at the voice's fixed gain):
    # the gate's highest gain -10.0 to -6.5 dB, the other's -1.2 to +1.2 dB, at least 5.4 dB
    # apart in each
    assert gate["gain_db_max"] <= -4.0
    assert before["gain_db_max"] >= gate["gain_db_max"] + 3.0
    summary = result["summary"]["gate"]
    assert [t["start_at_all"] for t in summary["talk_overs"]] == [1, 1]
