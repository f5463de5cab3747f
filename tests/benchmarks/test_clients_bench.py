"""The clients benchmark's pure parts: audibility, the playout of WebSocket deltas, the end of
speech a page's microphone meter shows, and the figures and table (no server, no models)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from benchmarks.clients_bench import (
    LOUD,
    WS_RATE,
    Playout,
    first_loud_frame,
    last_voiced_s,
    main,
    rms,
    speech_end,
    summarize,
    table,
)


def tone(n: int, amplitude: int) -> npt.NDArray[np.int16]:
    """``n`` samples of a square wave of ``amplitude`` (int16)."""
    return np.where(np.arange(n) % 2 == 0, amplitude, -amplitude).astype(np.int16)


def test_rms_is_a_share_of_full_scale_and_the_last_voiced_sample_is_found() -> None:
    assert rms(np.zeros(0, np.int16)) == 0.0
    assert rms(tone(960, 16384)) == pytest.approx(0.5)
    clip = np.concatenate([tone(480, 1000), np.zeros(480, np.int16)])
    assert last_voiced_s(clip, 48_000) == pytest.approx(480 / 48_000)
    assert last_voiced_s(np.zeros(10, np.int16), 48_000) == 0.0


def test_the_first_loud_frame_after_a_time() -> None:
    quiet, loud = tone(960, 100), tone(960, 3000)
    frames = [(1.0, loud), (2.0, quiet), (3.0, loud), (4.0, loud)]
    assert first_loud_frame(frames, 1.5) == 3.0  # the loud frame before the mark is not it
    assert first_loud_frame(frames, 4.0) is None
    assert rms(quiet) < LOUD < rms(loud)


def test_deltas_play_one_after_another_and_the_loud_20_ms_is_placed_in_them() -> None:
    playout = Playout()
    second = WS_RATE  # samples in one second
    # two deltas arriving together: the second plays after the first's second of silence
    playout.add(10.0, np.zeros(second, np.int16))
    playout.add(10.0, np.concatenate([np.zeros(second // 2, np.int16), tone(second, 3000)]))
    assert playout.end == pytest.approx(12.5)
    assert playout.first_loud(9.0) == pytest.approx(11.5)
    # a delta arriving after the queue ran dry plays from its arrival
    playout.add(20.0, tone(480, 3000))
    assert playout.first_loud(19.0) == pytest.approx(20.0)
    assert playout.first_loud(21.0) is None


def test_the_speech_ends_at_the_last_loud_reading_before_the_reply() -> None:
    levels = [[0.0, 0.0], [10.0, 0.2], [20.0, 0.3], [30.0, 0.001], [40.0, 0.0], [900.0, 0.5]]
    assert speech_end(levels, before=500.0) == 20.0
    assert speech_end(levels, before=5.0) is None


def test_figures_and_table() -> None:
    rounds: dict[str, list[dict[str, Any]]] = {
        "openai_ws": [
            {"connect_ms": 30.0, "typed_ms": 700.0, "spoken_ms": 900.0},
            {"connect_ms": 10.0, "typed_ms": 500.0, "spoken_ms": 1100.0},
            {"connect_ms": 20.0, "typed_ms": 600.0, "spoken_ms": None},
        ],
        "agents_ws": [{"error": "RuntimeError: refused"}],
    }
    results = summarize(rounds)
    ws = results["openai_ws"]
    assert (ws["connect"]["p50_ms"], ws["connect"]["max_ms"], ws["connect"]["n"]) == (20, 30, 3)
    assert (ws["spoken"]["p50_ms"], ws["spoken"]["n"]) == (1000, 2)  # the median of two
    assert results["agents_ws"]["typed"] == {
        "n": 0,
        "p50_ms": None,
        "max_ms": None,
        "samples_ms": [],
        "failures": ["RuntimeError: refused"],
    }
    lines = table(results).splitlines()
    assert lines[1].split() == ["openai_ws", "20", "/", "30", "600", "/", "700", "1000", "/",
                                "1100", "3"]  # fmt: skip
    assert lines[2].split() == ["agents_ws", "-", "-", "-", "0"]


def test_an_unknown_client_is_refused_before_anything_starts() -> None:
    with pytest.raises(SystemExit):
        main(["--clients", "telnet"])
