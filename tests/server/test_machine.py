"""What the benchmarks and the test header say about the machine."""

from __future__ import annotations

import os

from server.machine import Machine, parse_cpuinfo, this_machine

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
        == "AMD EPYC, 2 cores, AVX2 yes, AVX-512 yes (capped: CT2_FORCE_CPU_ISA=AVX2)"
    )
    assert "AVX-512 no" in Machine("x", 1, True, False, ()).describe()
