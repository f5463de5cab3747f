"""Start vLLM's OpenAI-compatible server on loopback as a subprocess (what ``vllm serve`` runs).

CPU settings as for the in-process engine (models/llm_vllm.py): eager mode, 32-token KV blocks,
a small KV cache (``VLLM_CPU_KVCACHE_SPACE``), the compile cache inside the project. Prefix
caching and ``prompt_tokens_details`` (cached tokens in the usage) are on, as in the
deployment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.server_process import ROOT, free_port, metric_value, terminate

STARTUP_TIMEOUT_S = 240.0  # ~25 s alone; minutes when other tests load the 2 cores


class VllmServer:
    """vLLM's API server on ``model_dir`` as ``served_name`` on 127.0.0.1, in its own process
    group."""

    def __init__(self, model_dir: Path, served_name: str = "tiny", kv_cache_gib: int = 1) -> None:
        self.model_dir = model_dir
        self.served_name = served_name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
            "VLLM_CACHE_ROOT": str(ROOT / ".cache" / "vllm"),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    def command(self) -> list[str]:
        return [
            # not `vllm serve`: its CLI asks for the distribution "vllm", here it is "vllm-cpu"
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", "bfloat16",
            "--max-model-len", "16384",
            "--block-size", "32",
            "--max-num-seqs", "4",
            "--enforce-eager",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> VllmServer:
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its engine processes share its process group
            )
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.tail()}")
            if self.healthy():
                self.startup_s = time.monotonic() - started
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vllm serve not healthy within {timeout} s:\n{self.tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def metric(self, name: str) -> float:
        """A metric's value summed over its labels, e.g. ``vllm:num_requests_running``."""
        return metric_value(self.metrics(), name)

    def tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server this object started; SIGKILL its process group if it lingers."""
        proc = self.proc
        if proc is None:
            return
        terminate(proc, timeout)
        with contextlib.suppress(ProcessLookupError):  # engine processes a kill left behind
            os.killpg(proc.pid, signal.SIGKILL)
