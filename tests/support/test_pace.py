"""The waits of the tests follow the load while they wait (tests/support/pace.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import pace
from tests.support.pace import MAX_PRESSURE, Patience, cpu_pressure


class Moments:
    """A clock the test moves (s)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def reference_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pace, "factor", lambda: 1.0)


def test_an_idle_machine_waits_the_bound() -> None:
    clock = Moments()
    patience = Patience(10.0, clock, lambda: 0.0)
    clock.now += 4.0
    assert patience.left() == pytest.approx(6.0)
    clock.now += 6.0
    assert patience.left() == 0.0


def test_time_the_machine_was_busy_elsewhere_does_not_count() -> None:
    clock, pressure = Moments(), [0.5]
    patience = Patience(10.0, clock, lambda: pressure[0])
    clock.now += 10.0  # half of it others' work
    assert patience.left() == pytest.approx(5.0)
    pressure[0] = 0.0  # the other jobs ended
    clock.now += 5.0
    assert patience.left() == 0.0
    assert patience.waited_s == pytest.approx(15.0)


def test_a_wait_is_bounded_however_busy_the_machine() -> None:
    clock = Moments()
    patience = Patience(10.0, clock, lambda: MAX_PRESSURE)
    clock.now += 10.0 / (1 - MAX_PRESSURE)
    assert patience.left() == pytest.approx(0.0, abs=1e-9)


def test_the_pressure_is_read_from_the_kernel(tmp_path: Path) -> None:
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=30.00 avg60=9.85 avg300=11.64 total=2834552983\n")
    assert cpu_pressure(str(psi)) == pytest.approx(0.3)
    psi.write_text("some avg10=99.00 avg60=0 avg300=0 total=0\n")
    assert cpu_pressure(str(psi)) == MAX_PRESSURE
    assert 0.0 <= cpu_pressure(str(tmp_path / "none")) <= MAX_PRESSURE  # the load average
