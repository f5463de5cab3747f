"""Benchmarks: ``python -m benchmarks`` runs the suite (see benchmarks/__main__.py)."""

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from server.machine import this_machine
from server.metrics import quantile

MIC_PEAK = 0.9  # of full scale: the loudest sample of the user's words as a microphone sends them


def pct(values: list[float], q: float) -> float:
    """Nearest-rank quantile; NaN when there are no values."""
    found = quantile(values, q)
    return float("nan") if found is None else found


def largest_passing(steps: list[dict[str, Any]], passes: Callable[[dict[str, Any]], bool]) -> int:
    """The ``sessions`` of the largest step that, with every smaller step before it, passes."""
    best = 0
    for step in steps:
        if not passes(step):
            break
        best = int(step["sessions"])
    return best


def git(*args: str) -> str:
    """What ``git ARGS`` prints (stripped); empty when it fails."""
    found = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    return found.stdout.strip()


def source_commit() -> str:
    """The commit the benchmark ran (short hash), ``+changes`` when tracked files differed from
    it: a figure from an uncommitted tree says so."""
    head = git("rev-parse", "--short", "HEAD")
    return f"{head}+changes" if git("status", "--porcelain", "--untracked-files=no") else head


def stamped(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with the machine (CPU model, ISA flags) and the commit it ran, unless the
    benchmark set them itself: every result file says where it came from."""
    machine = results.setdefault("machine", {})
    if isinstance(machine, dict):  # a benchmark's own fields (cpus, python) stay beside these
        machine.update({k: v for k, v in this_machine().to_dict().items() if k not in machine})
    results.setdefault("commit", source_commit())
    return results


def write_summarised(result: dict[str, Any], out: Path) -> None:
    """Stamp ``result`` (:func:`stamped`), print the machine and its ``summary``, and write it
    as JSON to ``out``."""
    stamped(result)
    print(f"machine: {this_machine().describe()}")
    print(json.dumps(result["summary"], indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


def at_mic_level(pcm: npt.NDArray[np.int16], peak: float = MIC_PEAK) -> npt.NDArray[np.int16]:
    """The user's words (int16, synthesized by the joe voice) with their loudest sample at
    ``peak`` of full scale: what a microphone sends does not follow the gain the server's own
    speech is made at."""
    loudest = int(np.max(np.abs(pcm.astype(np.int32)))) if pcm.size else 0
    if loudest == 0:
        return pcm
    scaled = np.round(pcm.astype(np.float64) * (peak * 32767 / loudest))
    return np.clip(scaled, -32768, 32767).astype(np.int16)
