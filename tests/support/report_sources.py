"""BENCHMARKS.md's figure tables, read back: every figure and the JSON it was taken from.

Each table of the report has the columns ``COLUMNS``. Its ``source`` cell names where the
numbers of its ``value`` cell come from, in the order they are printed:

    source = ref { "; " ref }
    ref    = files ": " path { ", " path }              one number per file and path
           | agg { "/" agg } "(" files ": " path { ", " path } ")"
                                                       one number per agg, over all of them
    files  = a file of benchmarks/reported/, "{a,b}" standing for each of a and b in turn
    path   = step { "." step } [ " x" factor ]         factor: the number is multiplied by it
    step   = key | list index (negative: from the end) | ["key with dots"]
           | [key=value] (the one list item whose key reads value) | * (every item or value)
    agg    = median | mean | min | max | sum | len (how many values)

A printed number matches where it is the JSON's number rounded to the printed decimals
(half a unit of the last printed digit either way). ``python -m tests.support.report_sources``
prints every row's numbers beside the JSON's.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "BENCHMARKS.md"
REPORTED = ROOT / "benchmarks" / "reported"
COLUMNS = ("kind", "figure", "value", "measured", "command", "source")
KINDS = ("client", "stage", "capacity", "quality", "security")  # in the order rows come
PROFILES = ("fast", "ordinary", "stress")
AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "median": lambda xs: float(statistics.median(xs)),
    "mean": lambda xs: float(statistics.fmean(xs)),
    "min": min,
    "max": max,
    "sum": lambda xs: float(sum(xs)),
    "len": lambda xs: float(len(xs)),
}
COMMIT = re.compile(r"\b[0-9a-f]{7}(?:\+changes)?(?![\w+])")
# a number as printed: thousands split by commas, a sign only where no digit comes before it
NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
STEP = re.compile(r'\["([^"]*)"\]|\[([^\]=]+)=([^\]]*)\]|([^.\[\]]+)')


class SourceError(ValueError):
    """A source cell that does not parse, or a path that leads to no number."""


@dataclass(frozen=True)
class Printed:
    """A number as the report prints it."""

    text: str
    value: float
    decimals: int

    def matches(self, exact: float) -> bool:
        """Whether ``exact`` rounds to this number at its printed decimals."""
        return abs(exact - self.value) <= 0.5 * 10.0**-self.decimals + 1e-9


@dataclass
class Row:
    line: int
    cells: dict[str, str]


@dataclass
class Table:
    """A table of the report, with the machine and profile of the section it is in."""

    heading: str
    line: int
    header: tuple[str, ...]
    machine: str | None
    profile: str | None
    rows: list[Row] = field(default_factory=list)


@dataclass(frozen=True)
class Ref:
    aggregates: tuple[str, ...]
    files: tuple[str, ...]
    paths: tuple[str, ...]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(text: str) -> list[Table]:
    """Every markdown table of ``text``, each with the last ``Machine:`` and ``Profile:`` lines
    (backquoted, and bold, as the report writes them) above it under its heading."""
    found: list[Table] = []
    heading, machine, profile = "", None, None
    lines = text.splitlines()
    n = 0
    while n < len(lines):
        line = lines[n]
        if line.startswith("#"):
            heading, machine, profile = line.lstrip("#").strip(), None, None
        if m := re.match(r"Machine: `([^`]+)`", line):
            machine = m.group(1)
        if m := re.search(r"Profile: \*\*(\w+)\*\*", line):
            profile = m.group(1)
        if line.startswith("|") and n + 1 < len(lines) and re.match(r"\|[-| :]+\|$", lines[n + 1]):
            table = Table(heading, n + 1, tuple(cells(line)), machine, profile)
            n += 2
            while n < len(lines) and lines[n].startswith("|"):
                row = cells(lines[n])
                table.rows.append(Row(n + 1, dict(zip(table.header, row, strict=False))))
                n += 1
            found.append(table)
            continue
        n += 1
    return found


def printed_numbers(cell: str) -> list[Printed]:
    """The numbers of a value cell, in order."""
    numbers = []
    for m in NUMBER.finditer(cell):
        text = m.group(0).replace(",", "")
        decimals = len(text.partition(".")[2])
        numbers.append(Printed(m.group(0), float(text), decimals))
    return numbers


def expand(files: str) -> tuple[str, ...]:
    """``a_{1,2}.json`` -> ``a_1.json``, ``a_2.json``."""
    parts = re.split(r"\{([^}]*)\}", files)
    choices = [[part] if i % 2 == 0 else part.split(",") for i, part in enumerate(parts)]
    return tuple("".join(c.strip() for c in combo) for combo in itertools.product(*choices))


def parse(source: str) -> list[Ref]:
    """The refs of a source cell (backquotes around it or its parts are ignored)."""
    refs = []
    for part in source.replace("`", "").split(";"):
        part = part.strip()
        if not part:
            continue
        aggregates: tuple[str, ...] = ()
        if m := re.fullmatch(r"([a-z]+(?:/[a-z]+)*)\((.*)\)", part):
            aggregates = tuple(m.group(1).split("/"))
            unknown = [a for a in aggregates if a not in AGGREGATES]
            if unknown:
                raise SourceError(f"unknown aggregate {unknown} in {part!r}")
            part = m.group(2)
        files, colon, paths = part.partition(":")
        if not colon or not files.strip().endswith(".json"):
            raise SourceError(f"expected 'file.json: path' in {part!r}")
        refs.append(
            Ref(aggregates, expand(files.strip()), tuple(p.strip() for p in paths.split(",")))
        )
    if not refs:
        raise SourceError("no source")
    return refs


def load(name: str, reported: Path = REPORTED) -> Any:
    path = reported / name
    if not path.is_file():
        raise SourceError(f"{path} does not exist")
    return json.loads(path.read_text())


def follow(data: Any, path: str) -> list[Any]:
    """Every value at ``path`` (``*`` steps give several)."""
    found = [data]
    for m in STEP.finditer(path):
        quoted, key, wanted, plain = m.groups()
        step: list[Any] = []
        for node in found:
            if quoted is not None:
                step.append(item(node, quoted, path))
            elif key is not None:
                if not isinstance(node, list):
                    raise SourceError(f"[{key}={wanted}] on a {type(node).__name__} in {path!r}")
                chosen = [x for x in node if isinstance(x, dict) and str(x.get(key)) == wanted]
                if len(chosen) != 1:
                    raise SourceError(f"{len(chosen)} items with {key}={wanted} in {path!r}")
                step.append(chosen[0])
            elif plain.strip() == "*":
                step.extend(node.values() if isinstance(node, dict) else node)
            else:
                step.append(item(node, plain.strip(), path))
        found = step
    return found


def item(node: Any, key: str, path: str) -> Any:
    if isinstance(node, list):
        try:
            return node[int(key)]
        except (ValueError, IndexError):
            raise SourceError(f"no item {key!r} in a list of {len(node)} in {path!r}") from None
    if isinstance(node, dict) and key in node:
        return node[key]
    raise SourceError(f"no {key!r} in {path!r}")


def number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise SourceError(f"{where} is {value!r}, not a number")
    return float(value)


def values(ref: Ref, reported: Path = REPORTED) -> list[float]:
    """The numbers a ref gives, in order."""
    out: list[float] = []
    pooled: list[tuple[Any, str, float]] = []  # value, where, factor
    for name in ref.files:
        data = load(name, reported)
        for spec in ref.paths:
            path, _, factor_text = spec.partition(" x")
            factor = float(factor_text) if factor_text else 1.0
            found = follow(data, path)
            if len(found) == 1 and isinstance(found[0], list):
                found = found[0]  # a list at the end of the path: its items
            where = f"{name}: {spec}"
            if ref.aggregates:
                pooled.extend((v, where, factor) for v in found)
            elif len(found) != 1:
                raise SourceError(f"{where} gives {len(found)} values: aggregate them")
            else:
                out.append(number(found[0], where) * factor)
    for aggregate in ref.aggregates:
        if aggregate == "len":
            out.append(float(len(pooled)))
        elif not pooled:
            raise SourceError(f"{ref.files}: nothing to aggregate")
        else:
            out.append(AGGREGATES[aggregate]([number(v, w) * f for v, w, f in pooled]))
    return out


def source_values(source: str, reported: Path = REPORTED) -> list[float]:
    return [v for ref in parse(source) for v in values(ref, reported)]


def source_files(source: str) -> list[str]:
    return [name for ref in parse(source) for name in ref.files]


def machine_line(data: Any) -> str | None:
    """A JSON's machine as the report's Machine lines write it, without its profile."""
    machine = data.get("machine") if isinstance(data, dict) else None
    if isinstance(machine, str):  # Machine.describe(): its quota, caps and profile cut off
        return re.split(r", CPU quota | \(capped: |; profile ", machine)[0]
    if not isinstance(machine, dict):
        return None

    def yes(flag: str) -> str:
        return "yes" if machine.get(flag) else "no"

    return (
        f"{machine['cpu_model']}, {machine['cores']} cores, "
        f"AVX2 {yes('avx2')}, AVX-512 {yes('avx512')}"
    )


def json_profile(data: Any) -> str:
    """fast, ordinary or stress, from what a JSON says of how its server ran."""
    machine = data.get("machine")
    quota = machine.get("cpu_quota") if isinstance(machine, dict) else None
    profile = str(data.get("profile", ""))
    named = machine.get("profile") if isinstance(machine, dict) else None
    if named in ("ordinary", "stress"):  # the benchmark's own process ran in it
        return str(named)
    if quota == 1.0 or re.search(r"(?<![\d.])1 CPUs", profile):
        return "ordinary"
    if quota == 0.5 or re.search(r"(?<![\d.])0\.5 CPUs", profile) or data.get("slow_server"):
        return "stress"
    if quota is not None or (profile and not profile.startswith("as is")):
        return f"other ({quota or profile})"
    return "fast"


def command_profile(command: str) -> str:
    """fast, ordinary or stress, from the command that measured a figure."""
    named = re.search(r"scripts/slow\.sh (ordinary|stress|fast)\b", command)
    if named:
        return named.group(1)
    if re.search(r"scripts/slow\.sh --cpus 1\b|--slow-cpus 1\b", command):
        return "ordinary"
    if "scripts/slow.sh" in command or "--slow-server" in command:
        return "stress"
    return "fast"


def command_module(command: str) -> str:
    """The benchmark a command runs (``scripts/slow.sh [--cpus N]`` and backquotes aside)."""
    words = command.replace("`", "").split()
    if words[:1] == ["scripts/slow.sh"]:
        words = words[3:] if words[1:2] == ["--cpus"] else words[1:]
        if words[:1] in (["ordinary"], ["stress"], ["fast"]):
            words = words[1:]
    return words[0] if words else ""


def rows(text: str) -> Iterator[tuple[Table, Row]]:
    for table in tables(text):
        for row in table.rows:
            yield table, row


def main() -> int:
    """Print every figure beside the numbers its source gives."""
    for table, row in rows(REPORT.read_text()):
        try:
            got = ", ".join(f"{v:g}" for v in source_values(row.cells.get("source", "")))
        except SourceError as error:
            got = f"ERROR {error}"
        print(f"{row.line}: [{table.heading}] {row.cells.get('value')!r} <- {got}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
