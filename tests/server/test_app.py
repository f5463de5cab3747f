"""The server process: starts from the command line, logs readiness, answers /healthz, stops."""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from server.http.app import LOWEST_PRIORITY, warm_avatar
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


class RecordingRenderer:
    """Notes the CPU priority each look is warmed at (and in which thread)."""

    appearances = ("a", "b")

    def __init__(self) -> None:
        self.warmed: list[tuple[str, int, int]] = []

    def warm(self, appearance: str, stop: threading.Event | None = None) -> None:
        tid = threading.get_native_id()
        self.warmed.append((appearance, tid, os.getpriority(os.PRIO_PROCESS, tid)))


def test_the_avatar_warm_up_yields_to_sessions_in_a_thread_of_its_own() -> None:
    renderer = RecordingRenderer()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(warm_avatar, renderer, threading.Event()).result()  # type: ignore[arg-type]
        after = pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        # the lowest priority: a live session's work always gets a core first
        assert [(name, nice) for name, _, nice in renderer.warmed] == [
            ("a", LOWEST_PRIORITY),
            ("b", LOWEST_PRIORITY),
        ]
        assert after.result() == LOWEST_PRIORITY  # it stays with the thread: hence its own
