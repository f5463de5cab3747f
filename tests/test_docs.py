"""The documents held to the code: the README short and CI's test command in it,
docs/configuration.md as its generator writes it today, no link to a file that is not there,
no setting that does not exist, and nothing that points outside the repository into the
shared folder beside it.

Plain text only: no server, no models, no network.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from scripts.config_doc import COMMAND, render
from server.config import describe

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 250
TEST_COMMAND = "./scripts/test.sh"


def documents() -> list[Path]:
    """The documents whose links must resolve."""
    named = [ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "BENCHMARKS.md"]
    return named + sorted((ROOT / "docs").glob("*.md"))


def without_code(text: str) -> str:
    """``text`` with fenced code blocks and inline code spans blanked out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


# [text](target) and ![alt](target), the text possibly over several lines; [name]: target
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)


def relative_links(text: str) -> Iterator[str]:
    """Every link target in markdown ``text`` that names a file of this repository."""
    prose = without_code(text)
    for match in [*INLINE_LINK.finditer(prose), *REFERENCE_LINK.finditer(prose)]:
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # http:, https:, mailto: ...; an anchor in the same file
        yield target.split("#", 1)[0].split("?", 1)[0]


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, over {README_MAX_LINES}: move the detail into docs/ "
        "and leave a one-line pointer"
    )


def test_readme_names_the_test_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(rf"^{re.escape(TEST_COMMAND)}\b", ci, re.MULTILINE), (
        ".ci/run no longer runs it"
    )
    readme = README.read_text(encoding="utf-8")
    assert re.search(rf"^{re.escape(TEST_COMMAND)}\s", readme, re.MULTILINE), (
        f"README.md's set-up must show the test command CI runs: {TEST_COMMAND}"
    )
    assert re.search(r"^\./scripts/run\.sh\s", readme, re.MULTILINE)


def test_configuration_doc_is_current() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == render(), (
        "docs/configuration.md is not what server.config.describe() gives today; "
        f"regenerate it: {COMMAND}"
    )


def test_configuration_doc_lists_every_setting() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name, env, _default, _help in describe():
        assert f"| `{name}` | `{env}` |" in text, f"{name} is missing; regenerate it: {COMMAND}"


def test_relative_links_point_to_files_that_exist() -> None:
    broken = []
    for doc in documents():
        for target in relative_links(doc.read_text(encoding="utf-8")):
            if target and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_link_finder_sees_links_over_lines_and_skips_code() -> None:
    text = (
        "See [the page](docs/a.md#x) and ![a\nlong alt](pic.png).\n"
        "[ref]: docs/b.md\n"
        "Not [this](https://example.com) nor [that](#here), nor `[code](c.md)`.\n"
        "```\n[fenced](d.md)\n```\n"
    )
    assert sorted(relative_links(text)) == ["docs/a.md", "docs/b.md", "pic.png"]


# a dotted name of a section, not preceded or followed by more of a path or a module name
SECTION_NAMES = sorted({name.split(".", 1)[0] for name, *_ in describe()})
SETTING_LIKE = re.compile(
    rf"(?<![\w./-])({'|'.join(SECTION_NAMES)})\.([a-z_][a-z0-9_]*)(\*?)(?![\w.:/(-])"
)
# names of that shape that are no setting: events, event fields, files
NOT_SETTINGS = frozenset(
    {
        "session.created",
        "session.update",
        "session.updated",
        "session.resume_token",
        "session.instructions",
        "session.audio",
        "session.tools",  # GA session fields (function calling)
        "session.tool_choice",
        "response.tools",
        "response.tool_choice",
        "avatar.tool",  # the native event of the avatar's own tools
        "session.applied",
        "vision.presence",
        "avatar.viseme",
        "avatar.example",  # a host name (server.allowed_hosts)
    }
)
FILE_SUFFIXES = frozenset({"py", "md", "json", "yaml", "yml", "toml", "cfg", "sh", "js", "png"})


def settings_named(text: str) -> Iterator[str]:
    """Every ``section.key`` in ``text`` that should be a setting (``key_*`` a prefix)."""
    for match in SETTING_LIKE.finditer(text):
        section, key, star = match.groups()
        name = f"{section}.{key}"
        if key in FILE_SUFFIXES or name in NOT_SETTINGS:
            continue
        yield name + star


# dated notebooks name settings as they were then (BENCHMARKS.md's history among them)
NOTEBOOKS = frozenset({"BENCHMARKS.md", "benchmarks-history.md"})


def test_settings_the_documents_name_exist() -> None:
    names = {name for name, *_ in describe()}
    unknown = []
    for doc in [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if doc.name in NOTEBOOKS:
            continue
        for named in settings_named(doc.read_text(encoding="utf-8")):
            prefix = named.rstrip("*")
            ok = (
                any(n.startswith(prefix) for n in names)
                if named.endswith(("*", "_"))
                else named in names
            )
            if not ok:
                unknown.append(f"{doc.relative_to(ROOT)}: {named}")
    assert not unknown, f"settings that server/config.py does not have: {unknown}"


def test_the_setting_finder() -> None:
    text = (
        "`vad.onset_ms`, `transport.video_*`, `session.max_detached*`, `session.update`, "
        "server/runtime/session.py, `server.pipeline.wiring:voice_pipeline`, "
        "--set runtime.voice=joe"
    )
    assert list(settings_named(text)) == [
        "vad.onset_ms",
        "transport.video_*",
        "session.max_detached*",
        "runtime.voice",
    ]


SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".venv",
        ".cache",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        "build",
        "node_modules",  # npm packages the tests install (tests/web/agents_sdk), not ours
    }
)
# the folder beside the repository, by a relative path or by an absolute one (not in a URL)
OUTSIDE_SHARED = re.compile(r"(?:\.\./)+shared\b|(?<![:/\w.~-])/(?:[\w.-]+/)*shared(?:/|\b)")


def project_files() -> Iterator[Path]:
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts):
            continue
        if parts[:2] == ("benchmarks", "results") or not path.is_file():
            continue
        if parts[0] == "shared":  # a copy of that folder some checkouts carry is not the project's
            continue
        yield path


def test_nothing_points_to_the_shared_folder_outside_the_repository() -> None:
    found = []
    for path in project_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # pictures and other binary files
        for match in OUTSIDE_SHARED.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)}")
    assert not found, f"files point outside the repository: {found}"


def test_the_shared_pattern() -> None:
    outside = [
        "../" + "shared/design.md",
        "../../" + "shared",
        "/work/" + "shared/x",
        "/" + "shared",
    ]
    inside = ["https://example.com/" + "shared/x", "tests/" + "shared/x", "shared caches"]
    assert all(OUTSIDE_SHARED.search(text) for text in outside)
    assert not any(OUTSIDE_SHARED.search(text) for text in inside)
