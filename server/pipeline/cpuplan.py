"""The CPU plan: how many threads each engine gets, from the cores this process may use.

One place decides it, from ``os.sched_getaffinity`` (a container's or ``taskset``'s mask, not
the machine's core count) and the cgroup's CPU quota (``docker --cpus``), so that no engine
assumes it owns the machine:

- the LLM's OpenMP threads are bound to cores of their own: the last core on up to 3 cores,
  the upper half of them on more; llama.cpp decodes on that many threads and reads a prompt
  (right after the final transcript, when the recogniser is done and speech not begun) on
  every core;
- the speech synthesiser runs while the LLM writes, so it gets the cores the LLM leaves;
- the speech recogniser's final transcript runs while the LLM and TTS wait for it (and its
  partials while the user speaks, when no reply is being made), so it may use every core, up
  to 4;
- the voice activity detector, the end-of-turn model and the avatar's background warm-up get
  one thread each;
- VP8 encoding is aiortc's: one thread per track below 640x480;
- the BLAS libraries loaded with numpy and OpenCV (OpenBLAS) get one thread
  (``BLAS_THREADS``): the products computed here are small (BLAS work was under 0.1 % of the
  server's CPU), and OpenBLAS's pool thread spins on a core after every call (7-14 % of a
  core with one or two sessions, measured); ``limit_blas_threads`` applies it;
- the engines' threads run ``engine_nice`` lower than the event loop and the media workers
  (``server.priority``): when both want a core, a frame leaves on time and a reply waits a
  little;
- under a quota of fewer CPUs than the mask's cores, every thread runs on the last
  ``ceil(quota)`` of them (``confined_to``; ``confine_threads`` applies it). A CFS quota is
  one pool of time for all the group's cores, and a nice value orders only threads that share
  a core: spread over the mask, an engine on one core spends the pool while the event loop,
  woken on another, waits for the next period (about 160 ms at the median in the slow
  profile's stalls, BENCHMARKS.md). On the quota's cores the loop's priority holds.

On 2 cores or more, what runs at the same time (LLM + TTS while a reply is made) adds up to at
most the cores.
An operator's explicit thread count (``pipeline.asr_threads`` / ``tts_threads`` > 0) wins.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from threadpoolctl import ThreadpoolController

from server.machine import this_machine
from server.osthreads import TASKS
from server.priority import ENGINE_NICE

log = logging.getLogger(__name__)

MAX_ASR_THREADS = 4  # CTranslate2 Whisper tiny gains little beyond this
MAX_TTS_THREADS = 4
BLAS_THREADS = 1  # numpy's and OpenCV's OpenBLAS: the caller's thread only, no pool that spins


@dataclass(frozen=True)
class CpuPlan:
    """Threads per engine; ``cores`` is the affinity mask the plan was made for."""

    cores: tuple[int, ...]
    llm_cores: tuple[int, ...]  # where the LLM's OpenMP threads are bound, one per core
    asr_threads: int
    tts_threads: int
    llm_prompt_threads: int = 1  # llama.cpp's threads for reading a prompt
    vad_threads: int = 1
    avatar_threads: int = 1
    blas_threads: int = BLAS_THREADS
    cpu_quota: float | None = None  # CPUs the cgroup grants, when less than the cores
    engine_nice: int = ENGINE_NICE  # how much lower the engines' threads run than the loop
    confined_to: tuple[int, ...] | None = None  # every thread's cores under a quota, if any

    def __post_init__(self) -> None:
        assert self.cores, "a plan needs at least one core"
        assert set(self.llm_cores) <= set(self.running), "the LLM is bound outside the cores"
        assert self.confined_to is None or set(self.confined_to) <= set(self.cores)
        assert self.asr_threads >= 1 and self.tts_threads >= 1
        assert 1 <= self.llm_prompt_threads <= len(self.cores)
        assert 0 <= self.engine_nice <= 19

    @property
    def running(self) -> tuple[int, ...]:
        """The cores the process runs on: ``confined_to`` under a quota, else the mask."""
        return self.confined_to or self.cores

    @property
    def llm_threads(self) -> int:
        """The LLM's decoding threads: one per core it is bound to."""
        return len(self.llm_cores)

    @property
    def llm_bind(self) -> str:
        """The LLM's cores as vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` list, e.g. ``"1"`` or
        ``"2,3"``."""
        return ",".join(str(core) for core in self.llm_cores)

    def describe(self) -> str:
        quota = "" if self.cpu_quota is None else f" (quota {self.cpu_quota:g} CPUs)"
        if self.confined_to is not None:
            quota += f", every thread on {list(self.confined_to)}"
        return (
            f"{len(self.cores)} cores {list(self.cores)}{quota}: LLM bound to"
            f" {list(self.llm_cores)} (prompts on {self.llm_prompt_threads} threads),"
            f" ASR {self.asr_threads} threads, TTS {self.tts_threads},"
            f" VAD {self.vad_threads}, avatar warm-up {self.avatar_threads},"
            f" BLAS {self.blas_threads};"
            f" engines at nice +{self.engine_nice}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "cores": list(self.cores),
            "llm_cores": list(self.llm_cores),
            "llm_prompt_threads": self.llm_prompt_threads,
            "asr_threads": self.asr_threads,
            "tts_threads": self.tts_threads,
            "vad_threads": self.vad_threads,
            "avatar_threads": self.avatar_threads,
            "blas_threads": self.blas_threads,
            "cpu_quota": self.cpu_quota,
            "engine_nice": self.engine_nice,
            "confined_to": None if self.confined_to is None else list(self.confined_to),
        }


def plan_cpus(
    cores: Iterable[int],
    asr_threads: int = 0,
    tts_threads: int = 0,
    cpu_quota: float | None = None,
    engine_nice: int = ENGINE_NICE,
    confine: bool = True,
) -> CpuPlan:
    """The plan for the cores in ``cores``, under a CFS quota of ``cpu_quota`` CPUs if any (a
    container's ``--cpus``: more threads than CPUs of time only queue up; with ``confine``,
    every thread goes to the last ``ceil(quota)`` cores);
    ``asr_threads``/``tts_threads`` > 0 are the operator's own choice and are kept."""
    mask = tuple(sorted(set(cores)))
    if not mask:
        raise ValueError("no cores to plan for")
    if cpu_quota is not None and cpu_quota <= 0:
        raise ValueError(f"cpu_quota must be > 0, got {cpu_quota}")
    n = len(mask)
    confined = None
    if cpu_quota is not None and cpu_quota < n:
        n = max(1, math.ceil(cpu_quota))
        confined = mask[-n:] if confine and n < len(mask) else None
    else:
        cpu_quota = None
    running = confined or mask
    llm = running[-1:] if n <= 3 else running[-(n - n // 2) :]
    asr = asr_threads or min(MAX_ASR_THREADS, n if n <= 2 else n // 2)
    tts = tts_threads or max(1, min(MAX_TTS_THREADS, n - len(llm)))
    return CpuPlan(
        mask,
        llm,
        asr,
        tts,
        llm_prompt_threads=n,
        cpu_quota=cpu_quota,
        engine_nice=engine_nice,
        confined_to=confined,
    )


def this_process_plan(
    asr_threads: int = 0, tts_threads: int = 0, engine_nice: int = ENGINE_NICE, confine: bool = True
) -> CpuPlan:
    """The plan for this process's affinity mask and cgroup CPU quota."""
    quota = this_machine().cpu_quota
    return plan_cpus(running_cores(), asr_threads, tts_threads, quota, engine_nice, confine)


def running_cores() -> set[int]:
    """The cores the calling thread may run on (its affinity mask; all of them where the OS
    has none)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def confine_threads(cores: Iterable[int], tasks: Path = TASKS) -> int:
    """Move every thread of this process (``tasks``: its /proc task directory) to ``cores``;
    the threads they start later take it from them. Returns how many were moved; 0 where
    affinity cannot be set (not Linux)."""
    wanted = set(cores)
    if not wanted:
        raise ValueError("no cores to confine to")
    if not hasattr(os, "sched_setaffinity"):
        return 0
    moved = 0
    for _ in range(2):  # a thread started while the first pass ran is caught by the second
        for task in sorted(tasks.iterdir()):
            tid = int(task.name)
            try:
                if os.sched_getaffinity(tid) != wanted:
                    os.sched_setaffinity(tid, wanted)
                    moved += 1
            except (ProcessLookupError, PermissionError):  # ended meanwhile, or not ours
                continue
    return moved


def limit_blas_threads(threads: int = BLAS_THREADS) -> list[str]:
    """Limit every BLAS library loaded in this process so far (numpy's OpenBLAS, OpenCV's) to
    ``threads`` threads, and log the change; returns one line per library changed. Call it
    again after a module that brings its own BLAS is imported: a library loaded later keeps its
    default (a thread per core)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    blas = ThreadpoolController().select(user_api="blas")
    changed = [
        f"{lib.internal_api} {lib.version} ({os.path.basename(lib.filepath)}):"
        f" {lib.num_threads} -> {threads} threads"
        for lib in blas.lib_controllers
        if lib.num_threads != threads
    ]
    if changed:
        blas.limit(limits=threads)
        for line in changed:
            log.info("BLAS: %s", line)
    return changed
