"""The CPU plan: every engine's threads from the affinity mask, never more than the cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from server.pipeline.cpuplan import (
    confine_threads,
    limit_blas_threads,
    plan_cpus,
    this_process_plan,
)


@pytest.mark.parametrize(
    "cores", [{0}, {0, 1}, {3, 7}, {0, 1, 2}, set(range(4)), {1, 3, 5, 7, 9, 11}, set(range(64))]
)
def test_plan_stays_inside_the_mask(cores: set[int]) -> None:
    plan = plan_cpus(cores)
    assert set(plan.cores) == cores
    assert set(plan.llm_cores) <= cores and plan.llm_cores
    n = len(cores)
    threads_each = (plan.asr_threads, plan.tts_threads, plan.vad_threads, plan.avatar_threads)
    for threads in (*threads_each, plan.llm_threads, plan.llm_prompt_threads):
        assert 1 <= threads <= n
    if n >= 2:
        # the LLM and the TTS work at the same time while a reply is made
        assert len(plan.llm_cores) + plan.tts_threads <= n
    assert plan.llm_bind == ",".join(str(c) for c in plan.llm_cores)


def test_two_cores_the_designed_for_machine() -> None:
    plan = plan_cpus({0, 1})
    assert plan.llm_cores == (1,)  # not core 0, where the event loop usually runs too
    assert plan.tts_threads == 1
    assert plan.asr_threads == 2  # the final transcript runs while the others wait for it
    assert plan.llm_threads == 1  # decoding, beside the speech synthesiser
    assert plan.llm_prompt_threads == 2  # the reply's prompt is read before any speech


def test_operator_thread_counts_win() -> None:
    plan = plan_cpus({0, 1}, asr_threads=3, tts_threads=5)
    assert (plan.asr_threads, plan.tts_threads) == (3, 5)


def test_no_cores_is_an_error() -> None:
    with pytest.raises(ValueError, match="no cores"):
        plan_cpus([])


def test_this_process_follows_its_affinity() -> None:
    mask = os.sched_getaffinity(0)
    assert set(this_process_plan().cores) == mask
    # a process pinned to one core (as by taskset or a container) plans for that core
    core = min(mask)
    child = subprocess.run(
        [sys.executable, "-c", "from server.pipeline.cpuplan import *; print(this_process_plan())"],
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"cores=({core},), llm_cores=({core},), asr_threads=1, tts_threads=1" in child.stdout


def test_a_cpu_quota_caps_the_threads() -> None:
    plan = plan_cpus(range(8), cpu_quota=1.5)  # docker --cpus=1.5 on an 8-core host
    assert plan.cpu_quota == 1.5 and "quota 1.5 CPUs" in plan.describe()
    assert plan.asr_threads == 2 and plan.tts_threads == 1 and len(plan.llm_cores) == 1
    slow = plan_cpus({0, 1}, cpu_quota=0.5)  # scripts/slow.sh
    assert (slow.asr_threads, slow.tts_threads, slow.llm_cores) == (1, 1, (1,))
    assert slow.llm_prompt_threads == 1 and plan.llm_prompt_threads == 2
    assert plan_cpus({0, 1}, cpu_quota=4.0).cpu_quota is None  # more than the cores: no cap
    with pytest.raises(ValueError, match="cpu_quota"):
        plan_cpus({0, 1}, cpu_quota=0.0)


def test_a_cpu_quota_confines_every_thread_to_its_cores() -> None:
    """Under a quota of fewer CPUs than the cores, the process runs on ceil(quota) of them
    (the last), the LLM among them; unless told not to, or the quota covers the mask."""
    slow = plan_cpus({0, 1}, cpu_quota=0.5)
    assert slow.confined_to == (1,) and slow.running == (1,) and slow.llm_cores == (1,)
    assert slow.cores == (0, 1)  # the mask it was given
    assert "every thread on [1]" in slow.describe() and slow.to_dict()["confined_to"] == [1]
    docker = plan_cpus(range(8), cpu_quota=2.5)
    assert docker.confined_to == (5, 6, 7) and set(docker.llm_cores) <= {5, 6, 7}
    assert docker.asr_threads <= 3 and docker.tts_threads + len(docker.llm_cores) <= 3
    spread = plan_cpus({0, 1}, cpu_quota=0.5, confine=False)
    assert spread.confined_to is None and spread.running == (0, 1)
    assert plan_cpus({0, 1}, cpu_quota=1.5).confined_to is None  # ceil: both cores
    assert plan_cpus({0, 1}).confined_to is None  # no quota
    assert plan_cpus({1}, cpu_quota=0.5).confined_to is None  # already on one core


CONFINE_CHILD = """
import json, os, threading
from server.pipeline.cpuplan import confine_threads
core = min(os.sched_getaffinity(0))
go, done = threading.Event(), threading.Event()
def waiting():
    go.wait()
    later = []
    child = threading.Thread(target=lambda: later.append(os.sched_getaffinity(0)))
    child.start(); child.join()
    done.later = sorted(later[0])
    done.set()
workers = [threading.Thread(target=waiting) for _ in range(3)]
for w in workers:
    w.start()
moved = confine_threads({core})
each = [sorted(os.sched_getaffinity(w.native_id)) for w in workers]
go.set(); done.wait(10)
for w in workers:
    w.join()
print(json.dumps({"core": core, "moved": moved, "main": sorted(os.sched_getaffinity(0)),
                  "each": each, "later": done.later, "again": confine_threads({core})}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to move between")
def test_confine_threads_moves_every_thread_and_what_they_start() -> None:
    """Run in a child, whose affinity the test may change: its main thread and three waiting
    threads all move to one core, a thread they start afterwards runs there too, and a
    second call finds nothing to move."""
    child = subprocess.run(
        [sys.executable, "-c", CONFINE_CHILD], capture_output=True, text=True, check=True
    )
    got = json.loads(child.stdout)
    core = got["core"]
    assert got["moved"] >= 4  # the main thread and the three workers at least
    assert got["main"] == [core] and got["each"] == [[core]] * 3 and got["later"] == [core]
    assert got["again"] == 0
    with pytest.raises(ValueError, match="no cores"):
        confine_threads(set())


BLAS_CHILD = """
import json, os
import numpy as np
from threadpoolctl import threadpool_info
from server.pipeline.cpuplan import limit_blas_threads
before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
changed = limit_blas_threads()
a = np.ones((300, 300))
assert float((a @ a)[0, 0]) == 300.0  # BLAS still multiplies, on the caller's thread
after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
print(json.dumps({"before": before, "changed": changed, "after": after,
                  "again": limit_blas_threads()}))
"""


def test_numpy_blas_gets_one_thread() -> None:
    """numpy's OpenBLAS starts a pool thread per core, which spins after every product; the
    plan gives BLAS one thread (the caller's), says what it changed, and a second call changes
    nothing. Run in a child so that its OpenBLAS starts as a server's does (two cores: 2)."""
    plan = plan_cpus({0, 1})
    assert plan.blas_threads == 1 and "BLAS 1" in plan.describe()
    assert plan.to_dict()["blas_threads"] == 1
    child = subprocess.run(
        [sys.executable, "-c", BLAS_CHILD],
        env={**os.environ, "OPENBLAS_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(child.stdout)
    assert report["before"] == [2], report  # numpy's OpenBLAS, as a 2-core machine starts it
    assert len(report["changed"]) == 1 and "2 -> 1 threads" in report["changed"][0]
    assert report["after"] == [1]
    assert report["again"] == []


def test_blas_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threads must be >= 1"):
        limit_blas_threads(0)
