"""realtime_bench's reading of the server's histograms between two scrapes."""

from __future__ import annotations

from benchmarks.realtime_bench import LATENESS, quantile_between


def _scrape(counts: dict[str, int]) -> str:
    """A /metrics text with LATENESS's cumulative buckets (two labelled series)."""
    lines = []
    for session in ("a", "b"):
        for le, count in counts.items():
            lines.append(f'{LATENESS}_bucket{{session="{session}",le="{le}"}} {count}')
    return "\n".join(lines)


def test_the_most_is_the_highest_bucket_observed_between_the_scrapes() -> None:
    before = _scrape({"0.005": 10, "0.02": 10, "0.05": 11, "+Inf": 11})
    # between the scrapes: 100 frames per series under 5 ms, one of them 5-20 ms late
    after = _scrape({"0.005": 110, "0.02": 111, "0.05": 112, "+Inf": 112})
    assert quantile_between(before, after, LATENESS, 0.99) == 0.005
    # the frame 20-50 ms late came before the first scrape: not counted
    assert quantile_between(before, after, LATENESS, 1.0) == 0.02
    assert quantile_between(after, after, LATENESS, 1.0) is None  # nothing observed
