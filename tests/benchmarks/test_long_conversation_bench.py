"""The long-conversation benchmark: a short run with a small window on the embedded GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.long_conversation_bench import main


@pytest.mark.e2e  # the embedded model on llama.cpp, about a minute
def test_a_window_that_slides_in_steps_keeps_the_prompt_cached(tmp_path: Path) -> None:
    out = tmp_path / "long.json"
    assert main(["--exchanges", "10", "--window-tokens", "90", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    steps, by_turn = result["steps"], result["turn_by_turn"]
    assert steps["window_full_from"] <= 6  # the window was full for half the run or more
    # once full, a window that slides a turn at a time is read again at every exchange
    assert by_turn["slides"] >= 2 and steps["slides"] < by_turn["slides"]
    assert steps["computed_tokens_total"] < by_turn["computed_tokens_total"]
    # the window moved on while nobody waited (after a reply): replies read a few tokens
    replies = [r["reply_computed"] for r in result["exchanges"]["steps"]]
    assert sorted(replies)[len(replies) // 2] <= 5
