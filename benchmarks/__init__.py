"""Benchmarks: ``python -m benchmarks`` runs the suite (see benchmarks/__main__.py)."""

from server.metrics import quantile


def pct(values: list[float], q: float) -> float:
    """Nearest-rank quantile; NaN when there are no values."""
    found = quantile(values, q)
    return float("nan") if found is None else found
