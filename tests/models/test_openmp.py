"""OpenMP's wait policy: the runtimes that Whisper (CTranslate2's own libgomp) and llama.cpp
(the system's) load inside ``passive_waits`` do not spin; the variable is gone after, and an
operator's own choice stands. Each case is a fresh interpreter: libgomp reads the variable
once, when it loads, and says what it read with ``OMP_DISPLAY_ENV=VERBOSE``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOAD = """
import os
from models.openmp import passive_waits
with passive_waits():
    import ctranslate2
    import xllamacpp
print("after:", os.environ.get("OMP_WAIT_POLICY"))
"""


def spin_counts(policy: str | None) -> tuple[list[str], str]:
    """The spin count each libgomp loaded in a fresh interpreter reports, and what the
    interpreter printed; ``policy``: the operator's OMP_WAIT_POLICY, if any. The environment
    is this one without OpenMP's variables and LD_PRELOAD: vLLM's CPU platform, once a test
    has started it, adds a libgomp to LD_PRELOAD here for its own children, and a server does
    not start with one."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "LD_PRELOAD" and not k.startswith(("OMP_", "GOMP_", "KMP_"))
    }
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run(
        [sys.executable, "-c", LOAD],
        cwd=ROOT,
        env={**env, "OMP_DISPLAY_ENV": "VERBOSE"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return re.findall(r"GOMP_SPINCOUNT = '(\d+)'", done.stderr), done.stdout


@pytest.mark.timeout(300)
def test_whisper_and_llamacpp_threads_sleep_when_they_wait() -> None:
    counts, out = spin_counts(None)
    assert counts == ["0", "0"]  # CTranslate2's libgomp and the one llama.cpp links
    assert "after: None" in out  # processes started later keep their own default


@pytest.mark.timeout(300)
def test_an_operators_wait_policy_stands() -> None:
    counts, out = spin_counts("ACTIVE")
    assert len(counts) == 2 and all(int(c) > 300_000 for c in counts)
    assert "after: ACTIVE" in out
