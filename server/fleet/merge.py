"""The workers' answers joined into the router's own: Prometheus text expositions (metrics
labelled ``worker="k"``) and JSON objects (``/debug/sessions``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from server.fleet.pool import Upstream


def _labelled(sample: str, worker: str) -> str:
    """A Prometheus sample line with ``worker="k"`` as its first label."""
    brace, space = sample.find("{"), sample.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = sample[brace + 1 :]
        sep = "" if rest.startswith("}") else ","
        return f'{sample[: brace + 1]}worker="{worker}"{sep}{rest}'
    return f'{sample[:space]}{{worker="{worker}"}}{sample[space:]}'


def merge_expositions(parts: Sequence[tuple[str, str]]) -> str:
    """Several Prometheus text expositions as one: each family once, samples labelled by worker.

    ``parts``: ``(worker label, text)``. HELP/TYPE come from the first text naming a family.
    """
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for worker, text in parts:
        family: str | None = None
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split(" ", 3)[2]
                kind = line[:6]
                if family not in headers:
                    headers[family], samples[family] = [], []
                if not any(h.startswith(kind) for h in headers[family]):
                    headers[family].append(line)
                continue
            if line.startswith("#"):
                continue
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            if family is None or not name.startswith(family):
                family = name
                headers.setdefault(family, [])
                samples.setdefault(family, [])
            samples[family].append(_labelled(line, worker))
    out: list[str] = []
    for family, lines in headers.items():
        out += lines
        out += samples[family]
    return "\n".join(out) + "\n" if out else ""


def pool_metrics(workers: Sequence[Upstream]) -> str:
    """The supervisor's own figures in Prometheus text."""
    lines = [
        "# HELP avatar_worker_up Worker takes new sessions (1) or not (0).",
        "# TYPE avatar_worker_up gauge",
        *(f'avatar_worker_up{{worker="{w.index}"}} {int(w.accepting)}' for w in workers),
        "# HELP avatar_worker_restarts_total Restarts of a worker after it exited.",
        "# TYPE avatar_worker_restarts_total counter",
        *(f'avatar_worker_restarts_total{{worker="{w.index}"}} {w.restarts}' for w in workers),
    ]
    return "\n".join(lines) + "\n"


def join_objects(objects: Sequence[Any]) -> dict[str, Any]:
    """JSON objects of several workers as one: lists concatenated, numbers summed, objects
    joined the same way (e.g. the task census); anything else as the first worker has it."""
    out: dict[str, Any] = {}
    for obj in objects:
        if not isinstance(obj, dict):
            continue
        for key, value in obj.items():
            if isinstance(value, list):
                out[key] = [*out.get(key, []), *value]
            elif isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
            elif isinstance(value, dict):
                out[key] = join_objects([out.get(key, {}), value])
            else:
                out.setdefault(key, value)
    return out
