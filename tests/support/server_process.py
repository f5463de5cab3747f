"""Start the real server as a subprocess on loopback and wait until /healthz answers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TONE_PIPELINE = "tests.support.tone_pipeline:create"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``python -m server`` with ``settings`` (dotted names) and extra environment."""

    def __init__(self, settings: dict[str, str] | None = None, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings = {"transport.ice_host_addresses": "127.0.0.1", **(settings or {})}
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"avatar-server-{self.port}.log"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        args = [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(self.port)]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                self.health()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server not ready within {timeout} s:\n{self.log()}")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
            return dict(json.loads(resp.read()))

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=2) as resp:
            return str(resp.read().decode())

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful shutdown) and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode)


def metric_value(text: str, name: str) -> float:
    """Sum of a metric's samples named exactly ``name`` (labels ignored) in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key.split("{")[0] == name:
            total += float(value)
    return total
