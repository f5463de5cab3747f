"""The process figures read at each scrape: the event loop's own CPU time and the whole
process's (benchmarks turn their rates into shares of a core)."""

from __future__ import annotations

import time

from server.metrics import Metrics
from tests.support.server_process import metric_value


def test_the_loops_cpu_is_read_at_each_scrape() -> None:
    metrics = Metrics()
    first = metric_value(metrics.render().decode(), "avatar_event_loop_cpu_seconds")
    busy_until = time.thread_time() + 0.005
    while time.thread_time() < busy_until:  # 5 ms of this thread's CPU (the scraping thread)
        pass
    text = metrics.render().decode()
    second = metric_value(text, "avatar_event_loop_cpu_seconds")
    assert second >= first + 0.005
    assert metric_value(text, "avatar_process_cpu_seconds") >= second  # every thread's
