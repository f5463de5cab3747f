"""The LLM benchmark: a quick run on the embedded GGUF with llama.cpp (real model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.llm_bench import main


@pytest.mark.e2e  # the embedded model on llama.cpp, a few seconds
def test_quick_run_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "llm.json"
    assert main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["engine"] == "llamacpp" and len(result["answers"]) == 3
    assert result["warm_ttft_ms_p50"] > 0 and result["decode_tokens_per_s_p50"] > 0
    # a warm reply computes only the end of the user's turn
    assert result["warm_uncached_tokens_p50"] < 20
    # a new session's first reply starts from the persona shared at start, not from nothing
    assert result["shared_prefix_tokens"] > 30
    assert result["cold_cached_tokens_p50"] >= result["shared_prefix_tokens"] - 2
    assert len(result["abort_close_ms"]) == 3 and result["machine"]["cores"] >= 1
