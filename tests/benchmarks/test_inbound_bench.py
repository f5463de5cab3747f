"""The inbound path benchmark, one pass an arm: the canceller rests through the user's turns,
what the recogniser hears there is the same sample for sample, and it takes the echo from a
reply after a rest as it does from one it heard the silence before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.inbound_bench import conversation, main, one_pass
from models.tts import OnnxVoiceTts


def test_one_pass_both_arms(tmp_path: Path) -> None:
    out = tmp_path / "inbound.json"
    assert main(["--repeats", "1", "--ablate", "rest", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["machine"]["cores"] >= 1 and result["commit"]
    rests, always = result["summary"]["rests"], result["summary"]["always"]
    assert rests["frames_rested"] > 0 and always["frames_rested"] == 0
    for arm in (rests, always):  # 36-40 dB measured, in both
        assert all(removed >= 25 for removed in arm["echo_removed_db_first_second_after_a_pause"])
        assert arm["cpu_us_per_20ms_avatar_silent"] > 0


def test_the_user_is_heard_the_same_while_the_canceller_rests() -> None:
    sent, mic, phases = conversation(OnnxVoiceTts(seed=1, cache_dir=None))
    _, rested, _ = one_pass(sent, mic, rests=True)
    _, always, _ = one_pass(sent, mic, rests=False)
    for first, last, avatar in phases:
        if not avatar:  # after 750 ms of quiet both pass the microphone through untouched
            span = range(first + 40, last)
            assert all(np.array_equal(rested[n], always[n]) for n in span)
