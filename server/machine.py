"""What machine this is: CPU model, usable cores, vector ISA. Benchmarks print it with their
figures and the tests print it in their header, because a figure from a fast machine says
little about a user's (a 2-core AVX2-only laptop is the machine we design for)."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

CPUINFO = "/proc/cpuinfo"
CGROUP_ROOT = "/sys/fs/cgroup"
# environment variables that cap the vector ISA of the libraries we use (the "slow profile")
ISA_CAPS = (
    "CT2_FORCE_CPU_ISA",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
)


@dataclass(frozen=True)
class Machine:
    """The CPU as this process sees it."""

    model: str
    cores: int  # that this process may run on (its affinity mask)
    avx2: bool
    avx512: bool
    isa_caps: tuple[str, ...]  # "NAME=value" of the ISA caps set in the environment
    cpu_quota: float | None = None  # CPUs the cgroup's CFS quota grants (docker --cpus)

    @property
    def profile(self) -> str:
        """The profile this runs in (scripts/slow.sh): "fast" (the host as it is),
        "ordinary" (the libraries' AVX-512 off, 1.0 CPU), "stress" (the same at 0.5 CPU),
        or "custom" for anything else (a quota without the caps, say a container's)."""
        if not self.isa_caps:
            return "fast" if self.cpu_quota is None or self.cpu_quota >= self.cores else "custom"
        if self.cpu_quota is not None and math.isclose(self.cpu_quota, 1.0):
            return "ordinary"
        if self.cpu_quota is not None and math.isclose(self.cpu_quota, 0.5):
            return "stress"
        return "custom"

    @property
    def cpus(self) -> float:
        """CPU time this process may use, in cores: its cores, or less under a quota."""
        return min(float(self.cores), self.cpu_quota or float(self.cores))

    def describe(self) -> str:
        """One line, e.g. ``AMD EPYC, 2 cores, AVX2 yes, AVX-512 no``."""
        yes = {True: "yes", False: "no"}
        line = f"{self.model}, {self.cores} cores, AVX2 {yes[self.avx2]}"
        line += f", AVX-512 {yes[self.avx512]}"
        if self.cpu_quota is not None:
            line += f", CPU quota {self.cpu_quota:g}"
        if self.isa_caps:
            line += f" (capped: {' '.join(self.isa_caps)})"
        return f"{line}; profile {self.profile}"

    def to_dict(self) -> dict[str, object]:
        return {
            "cpu_model": self.model,
            "cores": self.cores,
            "avx2": self.avx2,
            "avx512": self.avx512,
            "isa_caps": list(self.isa_caps),
            "cpu_quota": self.cpu_quota,
            "profile": self.profile,
        }


def parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    """The first processor's model name and flags in ``/proc/cpuinfo`` text."""
    model, flags = "unknown CPU", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def _quota_in(directory: Path) -> float | None:
    """CPUs of the CFS quota set in one cgroup directory (v2 ``cpu.max``, v1 ``cfs_*``)."""
    v2 = directory / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period)
    quota_file, period_file = directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us"
    if quota_file.is_file() and period_file.is_file():
        quota_us = int(quota_file.read_text())
        return None if quota_us <= 0 else quota_us / int(period_file.read_text())
    return None


def cgroup_cpu_quota(
    proc_cgroup: str = "/proc/self/cgroup", root: str = CGROUP_ROOT
) -> float | None:
    """CPUs this process's cgroup may use by its CFS quota (a container's ``--cpus``,
    ``scripts/slow.sh``); None when there is none or it cannot be read."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.lstrip("/")
        if hierarchy == "0" and not controllers:
            candidates = [Path(root) / relative]
        elif "cpu" in controllers.split(","):
            candidates = [Path(root) / name / relative for name in ("cpu", "cpu,cpuacct")]
        else:
            continue
        for directory in candidates:
            try:
                quota = _quota_in(directory)
            except (OSError, ValueError):
                continue
            if quota is not None:
                return quota
    return None


@functools.cache
def this_machine() -> Machine:
    try:
        with open(CPUINFO) as fh:
            model, flags = parse_cpuinfo(fh.read())
    except OSError:
        model, flags = "unknown CPU", set()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    caps = tuple(f"{name}={os.environ[name]}" for name in ISA_CAPS if os.environ.get(name))
    return Machine(model, cores, "avx2" in flags, "avx512f" in flags, caps, cgroup_cpu_quota())
