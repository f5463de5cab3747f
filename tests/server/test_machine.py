"""What the benchmarks and the test header say about the machine."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from server.machine import Machine, cgroup_cpu_quota, parse_cpuinfo, this_machine

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
"""


def test_cpuinfo_gives_the_model_and_the_flags() -> None:
    model, flags = parse_cpuinfo(CPUINFO)
    assert model == "AMD EPYC 7B13"
    assert {"avx2", "fma"} <= flags and "avx512f" not in flags
    assert parse_cpuinfo("") == ("unknown CPU", set())


def test_this_machine_counts_the_cores_it_may_use() -> None:
    machine = this_machine()
    assert machine.cores == len(os.sched_getaffinity(0))
    assert machine.to_dict()["cpu_model"] == machine.model


def test_description_names_the_isa_and_any_caps() -> None:
    slow = Machine("AMD EPYC", 2, True, True, ("CT2_FORCE_CPU_ISA=AVX2",))
    assert (
        slow.describe()
        == "AMD EPYC, 2 cores, AVX2 yes, AVX-512 yes (capped: CT2_FORCE_CPU_ISA=AVX2);"
        " profile custom"
    )
    assert "AVX-512 no" in Machine("x", 1, True, False, ()).describe()


def _cgroup(tmp_path: Path, lines: str) -> str:
    proc = tmp_path / "proc_cgroup"
    proc.write_text(lines)
    return str(proc)


def test_quota_of_a_v2_cgroup(tmp_path: Path) -> None:
    group = tmp_path / "root" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.max").write_text("150000 100000\n")
    proc = _cgroup(tmp_path, "0::/docker/abc\n")
    assert cgroup_cpu_quota(proc, str(tmp_path / "root")) == 1.5
    (group / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(proc, str(tmp_path / "root")) is None


def test_quota_of_a_v1_cgroup(tmp_path: Path) -> None:
    group = tmp_path / "root" / "cpu,cpuacct" / "slow"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text("10000\n")
    (group / "cpu.cfs_period_us").write_text("20000\n")
    proc = _cgroup(tmp_path, "4:memory:/x\n2:cpu,cpuacct:/slow\n0::/\n")
    assert cgroup_cpu_quota(proc, str(tmp_path / "root")) == 0.5
    (group / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(proc, str(tmp_path / "root")) is None


def test_no_cgroup_file_is_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(str(tmp_path / "missing"), str(tmp_path)) is None


def test_cpus_is_the_smaller_of_cores_and_quota() -> None:
    base = Machine("cpu", 4, True, False, ())
    assert base.cpus == 4.0
    assert Machine("cpu", 4, True, False, (), cpu_quota=0.5).cpus == 0.5
    assert "CPU quota 0.5" in Machine("cpu", 4, True, False, (), cpu_quota=0.5).describe()
    assert Machine("cpu", 2, True, False, (), cpu_quota=8.0).cpus == 2.0


def test_the_profile_is_named_from_the_caps_and_the_quota() -> None:
    caps = ("CT2_FORCE_CPU_ISA=AVX2",)
    assert Machine("cpu", 2, True, True, ()).profile == "fast"
    assert Machine("cpu", 2, True, True, caps, cpu_quota=1.0).profile == "ordinary"
    assert Machine("cpu", 2, True, True, caps, cpu_quota=0.5).profile == "stress"
    assert Machine("cpu", 2, True, True, (), cpu_quota=1.0).profile == "custom"
    assert Machine("cpu", 2, True, True, caps).profile == "custom"  # no cgroup: caps alone
    ordinary = Machine("cpu", 2, True, True, caps, cpu_quota=1.0)
    assert ordinary.describe().endswith("; profile ordinary")
    assert ordinary.to_dict()["profile"] == "ordinary"


def test_slow_sh_applies_the_profile_it_names() -> None:
    """The profile script's caps and quota, as the command it runs sees them (the quota only
    where this runs as root with a writable cgroup)."""
    script = "scripts/slow.sh"
    # the server reads its settings from AVATAR_* variables: the profile must set none
    code = (
        "import os; from server.config import load_config; load_config(None, os.environ, {});"
        " from server.machine import this_machine as m; print(m().to_dict())"
    )
    probe = [sys.executable, "-c", code]
    for name, quota in (("ordinary", 1.0), ("stress", 0.5)):
        out = subprocess.run(
            [script, name, *probe], capture_output=True, text=True, check=True, timeout=60
        )
        seen = ast.literal_eval(out.stdout.strip())
        assert "CT2_FORCE_CPU_ISA=AVX2" in seen["isa_caps"], out.stderr
        if "no writable cgroup" not in out.stderr:
            assert seen["cpu_quota"] == quota and seen["profile"] == name, out.stderr
    fast = subprocess.run(
        [script, "fast", *probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert ast.literal_eval(fast.stdout.strip())["isa_caps"] == []
