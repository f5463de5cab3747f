"""Write docs/configuration.md from ``server.config.describe()``.

    .venv/bin/python scripts/config_doc.py > docs/configuration.md

The table rows (dotted name, environment variable, default, help) come from the code; the
prose around them is kept here. tests/test_docs.py checks that the committed file is this
script's output, so a setting added, renamed or re-described in server/config.py fails the
test until the file is written again.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from server.config import describe, secret_settings

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ".venv/bin/python scripts/config_doc.py > docs/configuration.md"
LONGEST_DEFAULT = 48  # characters of a default shown in the table; a longer one is quoted below
WIDTH = 96  # the prose's line length, as in the other documents

INTRO = f"""\
# Configuration

<!-- Written by scripts/config_doc.py from server.config.describe(); do not edit by hand.
Regenerate it with: {COMMAND} -->

One frozen configuration object is built from, in rising precedence: defaults, a TOML file
(`--config FILE`), environment variables `AVATAR_<SECTION>_<KEY>`, and command-line options
(`--host`, `--port`, `--log-level`, and `--set section.key=value` for any setting). A list is
comma-separated in the environment and on the command line. Invalid values stop the server at
start with a message naming the setting, e.g.
`error: invalid configuration: server.port: must be <= 65535, got 99999`. Unknown `AVATAR_*`
variables and unknown TOML keys are errors too (typos do not pass silently).
`python -m server --help` lists every setting; `--print-config` shows the effective values.
`./scripts/run.sh` passes its options on (`./scripts/run.sh --port 9000 --config my.toml`).

Example `my.toml`:

```toml
[server]
port = 9000

[runtime]
lookahead_budget_ms = 1500
persona = "You are a patient language tutor."
```
"""

SECTIONS = {
    "server": "The HTTP server, the process and who may call it.",
    "runtime": "The session runtime: how far output runs ahead, history, the turn's deadlines.",
    "scheduler": "The order in which sessions' work runs on the shared engines.",
    "transport": "WebRTC, admission and the limits on what one client may send.",
    "vad": "When the user's turn ends, and what voice over a reply does.",
    "pipeline": "The models and engines that answer, and how they share the CPU.",
    "vision": "The client's camera.",
    "avatar": "The avatar's face beyond lip-sync: its own actions as tools.",
    "session": "Conversations that outlive their connection, and the client's event budget.",
}

NOTES = {
    "server.log_level": "`DEBUG`, `INFO`, `WARNING` or `ERROR`.",
    "server.auth_tokens": "pass tokens through the environment or the TOML file, not `--set` "
    "(command lines are visible to other local users).",
    "server.session_id_prefix": "with several hosts, give each its own (its name and a dot: "
    "`h1.`); a supervisor's worker k then names its sessions `h1.wk-<random>`.",
    "runtime.appearance": "`default` is the renderer's first look, `ada`.",
    "scheduler.policy": "`edf` (earliest deadline first, with aging) or `round_robin` (the "
    "baseline).",
    "transport.max_sessions": "counts live sessions only (a connection carries them); "
    "conversations waiting for a resume are bounded apart (`session.max_detached*`). "
    "Per worker with `server.workers`.",
    "transport.max_sessions_per_client": "a refusal is `429` with code `too_many_sessions`. "
    "Per worker.",
    "transport.max_remote_candidates": "a refusal is `422` with code `too_many_candidates`.",
    "transport.patch_rate_per_min": "a PATCH over it gets `429`.",
    "transport.private_candidates": "multicast, broadcast, unspecified addresses and DNS names "
    "are always dropped.",
    "transport.ice_host_addresses": "the tests pin `127.0.0.1`.",
    "transport.ice_anonymous_turn": "the compose and Kubernetes files set `deny`.",
    "transport.video": "a client that offers no video gets none anyway.",
    "pipeline.stage_timeout_s": "the reply fails with `engine_timeout`.",
    "pipeline.llm_remote_model": "required with `pipeline.llm_remote_urls`.",
    "session.max_detached_per_client": "loopback clients are exempt.",
    "pipeline.llm_kv_cache_gib": "the in-process vLLM engine's.",
}


def calibrated() -> list[str]:
    """The settings the calibration at start chooses where they are left unset."""
    source = (ROOT / "server" / "pipeline" / "calibration.py").read_text(encoding="utf-8")
    return sorted(set(re.findall(r'changed\["([a-z_]+\.[a-z_]+)"\]', source)))


def shown(value: Any) -> str:
    """A default as the table shows it."""
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, tuple):
        return ", ".join(f"`{item}`" for item in value) if value else "none"
    if value == "":
        return "empty"
    text = str(value)
    if len(text) > LONGEST_DEFAULT:
        return f"`{text[:LONGEST_DEFAULT].rstrip()}…` (below)"
    return f"`{text}`"


def cell(text: str) -> str:
    """Text that stays inside one table cell and is not read as emphasis."""
    return text.replace("|", "\\|").replace("*", "\\*").replace("\n", " ")


def names(items: Iterable[str]) -> str:
    return ", ".join(f"`{item}`" for item in items) or "none"


def item(text: str) -> list[str]:
    """One list item, wrapped."""
    return textwrap.wrap(
        text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False
    )


def render() -> str:
    """The whole of docs/configuration.md."""
    rows = describe()
    known = {row[0] for row in rows}
    unknown = sorted(set(NOTES) - known)
    if unknown:
        raise ValueError(
            f"scripts/config_doc.py has notes on settings that no longer exist: {unknown}"
        )
    lines = [INTRO.rstrip("\n")]
    section = ""
    long_defaults: list[tuple[str, str]] = []
    for name, env, default, help_text in rows:
        here = name.split(".", 1)[0]
        if here != section:
            section = here
            lines += ["", f"## {section}", ""]
            if section in SECTIONS:
                lines += [SECTIONS[section], ""]
            lines += ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
        if isinstance(default, str) and len(default) > LONGEST_DEFAULT:
            long_defaults.append((name, default))
        lines.append(f"| `{name}` | `{env}` | {shown(default)} | {cell(help_text)} |")
    lines += ["", "## More on some settings", ""]
    lines += item(
        f"Secret, never printed by `--print-config` or in the logs: {names(secret_settings())}."
    )
    lines += item(
        "Chosen at start by the calibration unless set (see [compute.md](compute.md)): "
        f"{names(calibrated())}."
    )
    for name in (row[0] for row in rows if row[0] in NOTES):
        lines += item(f"`{name}`: {NOTES[name]}")
    for name, default in long_defaults:
        lines += ["", f"The default of `{name}`:", ""]
        lines += textwrap.wrap(default, WIDTH, initial_indent="> ", subsequent_indent="> ")
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
