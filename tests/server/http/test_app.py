"""The server process: starts from the command line, logs readiness, answers /healthz, stops."""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from server.http.app import warm_avatar
from server.priority import LOWEST_PRIORITY
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

    def warm(
        self,
        appearance: str,
        stop: threading.Event | None = None,
        pace: Callable[[], None] | None = None,
    ) -> None:
        tid = threading.get_native_id()
        self.warmed.append((appearance, tid, os.getpriority(os.PRIO_PROCESS, tid)))
        if pace is not None:
            pace()  # between two sprites


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


def test_the_avatar_warm_up_waits_while_sessions_are_live() -> None:
    renderer = RecordingRenderer()
    live = [True, True, True]  # three looks at busy() while the first look waits

    def busy() -> bool:
        return bool(live) and live.pop()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(warm_avatar, renderer, threading.Event(), busy, 0.001).result()  # type: ignore[arg-type]
    assert [name for name, _, _ in renderer.warmed] == ["a", "b"]
    assert live == []  # it looked until the sessions were gone, then went on


def test_a_server_stopping_ends_a_warm_up_held_for_sessions() -> None:
    renderer = RecordingRenderer()
    stop = threading.Event()
    looks = 0

    def busy() -> bool:
        nonlocal looks
        looks += 1
        if looks == 3:
            stop.set()  # the server shuts down while a session is live
        return True

    with ThreadPoolExecutor(1) as pool:
        pool.submit(warm_avatar, renderer, stop, busy, 0.001).result()  # type: ignore[arg-type]
    assert [name for name, _, _ in renderer.warmed] == ["a"]  # the second look never began
