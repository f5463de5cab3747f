"""The server process: starts from the command line, logs readiness, answers /healthz, stops."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_server_starts_serves_health_and_shuts_down_gracefully() -> None:
    port = free_port()
    env = {
        **os.environ,
        "AVATAR_RUNTIME_LOOKAHEAD_BUDGET_MS": "1500",
        "AVATAR_PIPELINE_FACTORY": "",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        body = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and body is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert r.status == 200
                    body = json.loads(r.read())
            except OSError:
                time.sleep(0.1)
        assert body is not None and body["status"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
            assert r.status == 200 and b"<html" in r.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "lookahead budget 1500 ms" in out  # env config took effect and is logged
    assert "ready: listening on" in out
    assert "stopped" in out
