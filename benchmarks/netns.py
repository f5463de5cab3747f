"""Run a benchmark inside a network namespace with only loopback up (nothing leaves the host)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

MARK = "BENCH_NETNS_ISOLATED"


def isolate(module: str, argv: list[str]) -> None:
    """Re-execute ``python -m module argv`` under ``unshare --net`` unless already isolated.

    Without root (no unshare), runs on the host network as it is, and says so.
    """
    if os.environ.get(MARK) == "1":
        return
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode
    ):
        print("note: no network namespace available; running on the host network", file=sys.stderr)
        return
    script = f'ip link set lo up && {MARK}=1 exec "$0" -m {module} "$@"'
    os.execvp("unshare", ["unshare", "--net", "sh", "-c", script, sys.executable, *argv])
