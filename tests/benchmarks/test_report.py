"""BENCHMARKS.md: every figure of its tables is the number its JSON holds.

Each row names its source (``benchmarks/reported/*.json`` and a path in it; the syntax is in
tests/support/report_sources.py and at the top of the report). A row without one, a number
that no longer matches, a commit, machine or profile that is not the JSON's, or a command that
is not a benchmark of the table's profile fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import report_sources as rs

TEXT = rs.REPORT.read_text()
TABLES = rs.tables(TEXT)
ROWS = [(table, row) for table in TABLES for row in table.rows]
MAX_LINES = 300


def row_id(item: tuple[rs.Table, rs.Row]) -> str:
    table, row = item
    return f"line {row.line}: {table.heading}: {row.cells.get('figure', '')[:40]}"


def test_the_report_is_short_and_links_the_history() -> None:
    assert len(TEXT.splitlines()) <= MAX_LINES
    history = rs.ROOT / "docs" / "benchmarks-history.md"
    assert "](docs/benchmarks-history.md)" in TEXT
    assert history.is_file()


def test_every_table_is_a_figure_table_of_one_machine_and_profile() -> None:
    assert len(ROWS) >= 50, "the report's tables hold the current figures"
    for table in TABLES:
        where = f"line {table.line} ({table.heading})"
        assert table.header == rs.COLUMNS, f"{where}: columns {table.header}"
        assert table.machine, f"{where}: no 'Machine: `...`' line above it"
        assert table.profile in rs.PROFILES, f"{where}: profile {table.profile!r}"
    assert len({(t.machine, t.profile) for t in TABLES}) == len(TABLES), "one table each"


@pytest.mark.parametrize("item", ROWS, ids=row_id)
def test_every_figure_is_the_number_its_source_holds(item: tuple[rs.Table, rs.Row]) -> None:
    _, row = item
    source = row.cells.get("source", "")
    assert source, f"line {row.line}: the row has no source"
    printed = rs.printed_numbers(row.cells["value"])
    exact = rs.source_values(source)
    assert printed, f"line {row.line}: no number in {row.cells['value']!r}"
    assert len(printed) == len(exact), (
        f"line {row.line}: {len(printed)} numbers printed, {len(exact)} in the source"
    )
    for shown, value in zip(printed, exact, strict=True):
        assert shown.matches(value), f"line {row.line}: {shown.text} printed, the JSON has {value}"


@pytest.mark.parametrize("item", ROWS, ids=row_id)
def test_every_row_names_its_commit_and_ran_on_its_tables_machine(
    item: tuple[rs.Table, rs.Row],
) -> None:
    table, row = item
    commits, profiles = set(), set()
    for name in rs.source_files(row.cells["source"]):
        data = rs.load(name)
        if data.get("commit"):
            commits.add(data["commit"])
        machine = rs.machine_line(data)
        if machine is not None:
            assert machine == table.machine, f"line {row.line}: {name} ran on {machine}"
        profiles.add(rs.json_profile(data))
    assert set(rs.COMMIT.findall(row.cells["measured"])) == commits, f"line {row.line}"
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", row.cells["measured"]), f"line {row.line}: a date"
    assert profiles == {table.profile}, f"line {row.line}: the JSON says {profiles}"


@pytest.mark.parametrize("item", ROWS, ids=row_id)
def test_every_command_is_a_benchmark_run_in_its_tables_profile(
    item: tuple[rs.Table, rs.Row],
) -> None:
    table, row = item
    command = row.cells["command"]
    module = rs.command_module(command)
    assert (rs.ROOT / "benchmarks" / f"{module}.py").is_file(), f"line {row.line}: {command}"
    assert rs.command_profile(command) == table.profile, f"line {row.line}: {command}"
    assert row.cells["kind"] in rs.KINDS, f"line {row.line}"


def test_what_a_client_hears_comes_first_in_every_table() -> None:
    for table in TABLES:
        order = [rs.KINDS.index(row.cells["kind"]) for row in table.rows]
        assert order == sorted(order), f"{table.heading}: rows not in the order {rs.KINDS}"


def reported(tmp_path: Path, **files: object) -> Path:
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    return tmp_path


def test_a_source_reads_keys_indices_filters_and_factors(tmp_path: Path) -> None:
    folder = reported(
        tmp_path,
        a={"x": {"y": 0.0545, "0.10": {"z": 3}}, "runs": [{"run": "p/q", "n": 7}, {"n": 8}]},
        b_1={"v": 1.0, "l": [4, 5, 6]},
        b_2={"v": 3.0, "l": []},
    )
    assert rs.source_values('`a.json: x.y x100, x.["0.10"].z`', folder) == pytest.approx([5.45, 3])
    assert rs.source_values("a.json: runs.[run=p/q].n, runs.-1.n", folder) == [7.0, 8.0]
    assert rs.source_values("b_{1,2}.json: v", folder) == [1.0, 3.0]
    assert rs.source_values("median/min/max(b_{1,2}.json: v)", folder) == [2.0, 1.0, 3.0]
    assert rs.source_values("len(b_2.json: l); sum(b_1.json: l)", folder) == [0.0, 15.0]
    assert rs.source_values("max(a.json: runs.*.n)", folder) == [8.0]
    for bad in ("a.json: x.none", "a.json: runs.*.n", "c.json: v", "a.json", "avg(a.json: x.y)"):
        with pytest.raises(rs.SourceError):
            rs.source_values(bad, folder)


def test_printed_numbers_are_read_as_printed() -> None:
    found = rs.printed_numbers("2,191 (1,880-2,207) ms; -20 ms, 0.092; 18 of 19; 5.5 %")
    assert [n.value for n in found] == [2191, 1880, 2207, -20, 0.092, 18, 19, 5.5]
    assert [n.decimals for n in found] == [0, 0, 0, 0, 3, 0, 0, 1]
    five = rs.printed_numbers("5.5 %")[0]
    assert five.matches(0.0545 * 100) and five.matches(5.549) and not five.matches(5.56)


def test_the_profile_is_read_from_the_json_and_the_command() -> None:
    quota = {"machine": {"cpu_quota": 0.5}}
    assert rs.json_profile(quota) == "stress"
    assert rs.json_profile({"machine": {"cpu_quota": 1.0}}) == "ordinary"
    assert rs.json_profile({"slow_server": True, "machine": {"cpu_quota": None}}) == "stress"
    assert rs.json_profile({"profile": "server in the slow profile (x, 1 CPUs)"}) == "ordinary"
    assert rs.json_profile({"profile": "as is: shared"}) == "fast"
    assert rs.json_profile({"profile": "server alone on core 0"}).startswith("other")
    assert rs.command_profile("`scripts/slow.sh --cpus 1 words_bench`") == "ordinary"
    assert rs.command_profile("`scripts/slow.sh ordinary realtime_bench`") == "ordinary"
    assert rs.command_profile("`scripts/slow.sh stress realtime_bench`") == "stress"
    assert rs.command_module("`scripts/slow.sh ordinary realtime_bench --quick`") == (
        "realtime_bench"
    )
    assert rs.command_profile("realtime_bench --slow-server --slow-cpus 1") == "ordinary"
    assert rs.command_profile("scripts/slow.sh asr_bench --threads 1") == "stress"
    assert rs.command_profile("interjection_bench --slow-server") == "stress"
    assert rs.command_module("`scripts/slow.sh --cpus 1 words_bench`") == "words_bench"
