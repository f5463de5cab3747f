"""The CPU time a server's threads spend, by role, sampled from /proc while a benchmark runs.

The server names its threads as the OS shows them (``server/osthreads.py``): ``llm-load_0``
(llama.cpp's threads start from it), ``asr_0``, ``tts_0``, ``gruut_0``, ``asyncio_N`` (the
default executor: the avatar's drawing, the end-of-turn model, encoding). Each thread's time on
a CPU (``/proc/<pid>/task/<tid>/schedstat``, ns) is read every ``every_s`` and added up by
role; ``between(t0, t1)`` gives each role's CPU ms between two instants of
``time.monotonic()`` (the same clock in every process of the machine).
"""

from __future__ import annotations

import bisect
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROC = Path("/proc")
EVERY_S = 0.02  # 90 threads read in about 0.5 ms: 2-3 % of a core at this rate
RENAMES_EVERY = 50  # samples between readings of a thread's name (the server names its threads)
ROLES = (  # name prefix -> role, the first that matches
    ("llm", "llm"),
    ("llamacpp", "llm"),
    ("asr", "asr"),
    ("tts", "tts"),
    ("gruut", "tts"),
    ("asyncio_", "executor"),
    ("audio-", "media"),
    ("video-", "media"),
    ("avatar-warm", "avatar warm-up"),
)


def role(tid: int, pid: int, name: str) -> str:
    """The role of thread ``tid`` of process ``pid`` by its OS name (the main thread runs the
    event loop)."""
    if tid == pid:
        return "loop"
    return next((r for prefix, r in ROLES if name.startswith(prefix)), "other")


def server_pid(root: int, proc: Path = PROC) -> int | None:
    """The ``python -m server`` process at or below process ``root`` (a wrapper such as
    scripts/slow.sh starts it as a child); None if there is none."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            args = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
            children = (proc / str(pid) / "task" / str(pid) / "children").read_text().split()
        except OSError:
            continue
        if args[1:3] == [b"-m", b"server"]:  # not a wrapper that names it among its arguments
            return pid
        todo.extend(int(c) for c in children)
    return None


class ThreadCpu:
    """Samples process ``pid``'s threads in a thread of its own from ``start()`` to ``stop()``
    (at most ``limit_s``)."""

    def __init__(
        self,
        pid: int,
        every_s: float = EVERY_S,
        limit_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        proc: Path = PROC,
    ) -> None:
        self.pid = pid
        self._every_s = every_s
        self._limit_s = limit_s
        self._clock = clock
        self._tasks = proc / str(pid) / "task"
        self._names: dict[int, str] = {}
        self._files: dict[int, int] = {}  # tid -> its schedstat, open
        self._last: dict[int, int] = {}  # tid -> its CPU ns at the last sample
        self._totals: dict[str, int] = {}  # role -> CPU ns, summed over its threads so far
        self.times: list[float] = []
        self.samples: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-cpu", daemon=True)

    def start(self) -> ThreadCpu:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=5)
        for tid in list(self._files):
            self._forget(tid)

    def sample(self) -> None:
        """Read every thread's CPU time once and add what each spent since the last sample to
        its role's total (each thread's schedstat stays open: a read is a few microseconds)."""
        try:
            tids = [int(t) for t in os.listdir(self._tasks)]
        except OSError:
            return  # the process has ended
        rename = len(self.samples) % RENAMES_EVERY == 0
        for tid in tids:
            try:
                if tid not in self._files:
                    self._files[tid] = os.open(self._tasks / str(tid) / "schedstat", os.O_RDONLY)
                ns = int(os.pread(self._files[tid], 64, 0).split()[0])
                if rename or tid not in self._names:
                    self._names[tid] = (self._tasks / str(tid) / "comm").read_text().strip()
            except (OSError, ValueError, IndexError):
                self._forget(tid)  # the thread ended meanwhile
                continue
            kind = role(tid, self.pid, self._names[tid])
            self._totals[kind] = self._totals.get(kind, 0) + ns - self._last.get(tid, 0)
            self._last[tid] = ns
        for tid in set(self._files) - set(tids):
            self._forget(tid)
        self.times.append(self._clock())
        self.samples.append(dict(self._totals))

    def _forget(self, tid: int) -> None:
        """Drop an ended thread: its time stays in its role's total, and a new thread given
        its id later starts from nothing (its name read again)."""
        self._last.pop(tid, None)
        self._names.pop(tid, None)
        fd = self._files.pop(tid, None)
        if fd is not None:
            os.close(fd)

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU ms by role between the samples at or just after ``t0`` and ``t1``."""
        if not self.times or t1 <= t0:
            return {}
        i = min(bisect.bisect_left(self.times, t0), len(self.times) - 1)
        j = min(bisect.bisect_left(self.times, t1), len(self.times) - 1)
        a, b = self.samples[i], self.samples[j]
        return {k: (b[k] - a.get(k, 0)) / 1e6 for k in b if b[k] != a.get(k, 0)}

    def _run(self) -> None:
        ends = self._clock() + self._limit_s
        while not self._stop.is_set() and self._clock() < ends:
            self.sample()
            self._stop.wait(self._every_s)


STAGES = (  # a reply's stages, between the marks of its response.timings (ms after the endpoint)
    ("to_first_token", None, "llm_first_token_ms"),
    ("to_first_chunk", "llm_first_token_ms", "first_chunk_text_ms"),
    ("to_first_speech", "first_chunk_text_ms", "first_tts_ms"),
)


def stage_cpu(cpu: ThreadCpu, endpoint_at: float, timings: dict[str, Any]) -> dict[str, Any]:
    """Each stage of one reply: its wall ms and the CPU ms each role spent in it, from the
    endpoint at ``endpoint_at`` (``time.monotonic()``, s) and the reply's timings."""
    out: dict[str, Any] = {}
    for stage, start, end in STAGES:
        a = 0.0 if start is None else timings.get(start)
        b = timings.get(end)
        if a is None or b is None or b <= a:
            continue
        spent = cpu.between(endpoint_at + a / 1000, endpoint_at + b / 1000)
        out[stage] = {"wall_ms": round(b - a, 1), **{k: round(v, 1) for k, v in spent.items()}}
    return out


def stage_cpu_p50(turns: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The median over ``turns`` of each stage's wall ms and each role's CPU ms (a role
    absent from a turn's stage spent 0 there), and of the cores the process used (CPU over
    wall)."""
    out: dict[str, dict[str, float]] = {}
    for stage, _, _ in STAGES:
        seen = [t["stage_cpu_ms"][stage] for t in turns if stage in t.get("stage_cpu_ms", {})]
        if not seen:
            continue
        keys = sorted({k for s in seen for k in s})
        out[stage] = {k: round(statistics.median(s.get(k, 0.0) for s in seen), 1) for k in keys}
        cores = [sum(v for k, v in s.items() if k != "wall_ms") / s["wall_ms"] for s in seen]
        out[stage]["cores"] = round(statistics.median(cores), 2)
    return out
