"""The server process: starts from the command line, logs readiness, answers /healthz, stops."""

from __future__ import annotations

import json
import urllib.request

from tests.support.server_process import ServerProcess


def test_server_starts_serves_health_and_shuts_down_gracefully() -> None:
    server = ServerProcess(
        env={"AVATAR_RUNTIME_LOOKAHEAD_BUDGET_MS": "1500", "AVATAR_PIPELINE_FACTORY": ""}
    ).start(timeout=30)
    try:
        with urllib.request.urlopen(f"{server.url}/healthz", timeout=2) as r:
            assert r.status == 200
            body = json.loads(r.read())
        assert body["status"] == "ok"
        with urllib.request.urlopen(f"{server.url}/", timeout=2) as r:
            assert r.status == 200 and b"<html" in r.read()
    finally:
        code = server.stop()
    assert code == 0
    out = server.log()
    assert "lookahead budget 1500 ms" in out  # env config took effect and is logged
    assert "ready: listening on" in out
    assert "stopped" in out
