"""thread_cpu: a server's threads' CPU time by role, from a /proc tree (a fake one here, and
this process's own)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from benchmarks.thread_cpu import ThreadCpu, role, server_pid, stage_cpu, stage_cpu_p50


def _task(proc: Path, pid: int, tid: int, name: str, ns: int) -> None:
    folder = proc / str(pid) / "task" / str(tid)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "comm").write_text(name + "\n")
    (folder / "schedstat").write_text(f"{ns} 0 0\n")


def _process(proc: Path, pid: int, args: list[str], children: list[int]) -> None:
    folder = proc / str(pid) / "task" / str(pid)
    folder.mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
    (folder / "children").write_text(" ".join(map(str, children)))


def test_roles_come_from_the_names_the_server_gives_its_threads() -> None:
    assert role(10, 10, "python") == "loop"  # the main thread
    assert role(11, 10, "llm-load_0") == "llm"  # llama.cpp's threads start from it
    assert role(12, 10, "llamacpp_1") == "llm"
    assert role(13, 10, "asr_0") == "asr"
    assert role(14, 10, "gruut_0") == "tts"
    assert role(15, 10, "asyncio_3") == "executor"
    assert role(16, 10, "audio-decoder") == "media"
    assert role(17, 10, "python") == "other"  # not named (yet)


def test_the_server_is_found_below_its_wrapper(tmp_path: Path) -> None:
    _process(tmp_path, 100, ["bash", "scripts/slow.sh", "--", "python", "-m", "server"], [101])
    _process(tmp_path, 101, ["/venv/bin/python", "-m", "server", "--port", "1"], [])
    assert server_pid(100, tmp_path) == 101  # the wrapper names it among its arguments
    assert server_pid(101, tmp_path) == 101
    _process(tmp_path, 200, ["sleep", "9"], [])
    assert server_pid(200, tmp_path) is None


def test_each_role_adds_what_its_threads_spent_between_samples(tmp_path: Path) -> None:
    now = [0.0]
    cpu = ThreadCpu(7, clock=lambda: now[0], proc=tmp_path)
    _task(tmp_path, 7, 7, "python", 5_000_000)
    _task(tmp_path, 7, 8, "tts_0", 1_000_000)
    cpu.sample()
    now[0] = 1.0
    _task(tmp_path, 7, 7, "python", 9_000_000)  # the loop: 4 ms more
    _task(tmp_path, 7, 8, "tts_0", 31_000_000)  # the voice: 30 ms more
    _task(tmp_path, 7, 9, "asr_0", 2_000_000)  # a new thread: all it spent
    cpu.sample()
    now[0] = 2.0
    for name in ("comm", "schedstat"):
        (tmp_path / "7" / "task" / "8" / name).unlink()
    (tmp_path / "7" / "task" / "8").rmdir()  # the voice's thread ended: its time stays counted
    _task(tmp_path, 7, 7, "python", 10_000_000)
    cpu.sample()
    now[0] = 3.0
    _task(tmp_path, 7, 8, "asyncio_0", 3_000_000)  # a new thread given the ended one's id
    cpu.sample()
    assert cpu.between(2.0, 3.0) == {"executor": 3.0}  # all it spent, under its own name
    assert cpu.between(0.0, 1.0) == {"loop": 4.0, "tts": 30.0, "asr": 2.0}
    assert cpu.between(1.0, 2.0) == {"loop": 1.0}
    assert cpu.between(0.0, 2.0) == {"loop": 5.0, "tts": 30.0, "asr": 2.0}
    assert cpu.between(0.5, 0.5) == {}


def test_stages_are_cut_at_the_replys_timings() -> None:
    cpu = ThreadCpu(1)
    cpu.times = [10.0, 10.2, 10.5, 10.9]
    cpu.samples = [{"llm": 0}, {"llm": 100_000_000}, {"llm": 150_000_000, "tts": 0}]
    cpu.samples.append({"llm": 160_000_000, "tts": 70_000_000})
    timings = {"llm_first_token_ms": 200.0, "first_chunk_text_ms": 500.0, "first_tts_ms": 900.0}
    stages = stage_cpu(cpu, 10.0, timings)
    assert stages == {
        "to_first_token": {"wall_ms": 200.0, "llm": 100.0},
        "to_first_chunk": {"wall_ms": 300.0, "llm": 50.0},
        "to_first_speech": {"wall_ms": 400.0, "llm": 10.0, "tts": 70.0},
    }
    assert stage_cpu(cpu, 10.0, {"llm_first_token_ms": 200.0}) == {
        "to_first_token": {"wall_ms": 200.0, "llm": 100.0}
    }
    other = {"to_first_token": {"wall_ms": 400.0, "llm": 100.0, "loop": 20.0}}
    medians = stage_cpu_p50([{"stage_cpu_ms": stages}, {"stage_cpu_ms": other}, {}])
    # a role absent from one turn's stage spent nothing there
    assert medians["to_first_token"] == {"llm": 100.0, "loop": 10.0, "wall_ms": 300.0, "cores": 0.4}
    assert medians["to_first_speech"]["cores"] == 0.2


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc here")
def test_this_process_busy_thread_is_seen() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    busy = threading.Thread(target=spin, name="tts_0")
    busy.start()
    assert busy.native_id is not None
    Path(f"/proc/self/task/{busy.native_id}/comm").write_text("tts_0")
    cpu = ThreadCpu(os.getpid())
    try:
        cpu.sample()
        start = time.thread_time()
        while time.thread_time() - start < 0.05:  # this thread waits on CPU, not on a clock
            pass
        cpu.sample()
    finally:
        stop.set()
        busy.join()
    spent = cpu.between(cpu.times[0], cpu.times[1])
    assert spent.get("tts", 0.0) > 0.0
