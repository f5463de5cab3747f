"""The architecture of docs/architecture.md, held by the source itself.

Every module under server/ and models/ is parsed with ``ast``, never imported, so
these tests need no server, no models and no network. An import counts wherever it is written:
at the top, inside a function (the lazy imports of server/pipeline/wiring.py) or under
``if TYPE_CHECKING:`` (a type-only import is still a dependency of the design, so it is held
to the same rules; none of the rules below needed an exception for it).

An import names the most specific module that exists: ``from server.runtime import session``
is an edge to ``server.runtime.session``, ``from server.runtime.session import Session`` too,
and ``from server import config`` is an edge to ``server.config``. The parent packages that
Python also runs (``server/runtime/__init__.py``) are not counted: they hold docstrings only,
and ``test_package_inits_import_nothing`` keeps it so.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# Top to bottom; a module may import from its own layer or a lower one. Modules directly in
# server/ (and server/__init__.py) are the root; server/__main__.py is above everything.
LAYERS = (
    "server.__main__",
    "server.fleet",
    "server.http",
    "server.rtc",
    "server.conversation",
    "server.wire",
    "server.pipeline",
    "server.vision",
    "server.avatar",
    "server.scheduling",
    "server.runtime",
    "root",
)

# The one composition root that names model backends.
MODELS_ALLOWED = frozenset({"server.pipeline.wiring"})


@dataclass(frozen=True)
class Import:
    """One import statement's target: a dotted module name, where it was written."""

    target: str
    line: int
    type_only: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(package: str) -> dict[str, Path]:
    """Every module of a top-level package: dotted name -> file."""
    return {
        module_name(path): path
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


@cache
def server_modules() -> dict[str, Path]:
    return modules_under("server")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node below ``node``, and whether it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            yield child, type_only
            for stmt in child.body:
                yield stmt, True
                yield from _walk(stmt, True)
            for stmt in child.orelse:
                yield stmt, type_only
                yield from _walk(stmt, type_only)
            continue
        yield child, type_only
        yield from _walk(child, type_only)


def _base_package(name: str, is_package: bool, level: int) -> str:
    """The package a relative import with ``level`` dots starts from."""
    parts = name.split(".")
    if not is_package:
        parts.pop()
    return ".".join(parts[: len(parts) - (level - 1)] if level > 1 else parts)


def imports_of(source: str, name: str, is_package: bool = False) -> list[Import]:
    """The modules a module's source imports (absolute dotted names, relative ones resolved).
    ``from a import b`` gives ``a.b``, which resolve() turns into the module ``a.b`` when there
    is one, else into ``a`` (``b`` is a name defined in ``a``)."""
    found: list[Import] = []
    for node, type_only in _walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, type_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _base_package(name, is_package, node.level)
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.extend(
                Import(
                    module if alias.name == "*" else f"{module}.{alias.name}",
                    node.lineno,
                    type_only,
                )
                for alias in node.names
            )
    return found


def resolve(target: str, known: dict[str, Path]) -> str | None:
    """The most specific known module ``target`` names, or None if it is outside them."""
    parts = target.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


@cache
def raw_imports() -> dict[str, tuple[Import, ...]]:
    """Every server module's imports as written (targets not resolved)."""
    out: dict[str, tuple[Import, ...]] = {}
    for name, path in server_modules().items():
        source = path.read_text(encoding="utf-8")
        out[name] = tuple(imports_of(source, name, path.name == "__init__.py"))
    return out


@cache
def server_graph() -> dict[str, dict[str, Import]]:
    """server module -> the server modules it imports (each with its first import)."""
    known = server_modules()
    graph: dict[str, dict[str, Import]] = {}
    for name, found in raw_imports().items():
        edges: dict[str, Import] = {}
        for imp in found:
            if not (imp.target == "server" or imp.target.startswith("server.")):
                continue
            target = resolve(imp.target, known)
            if target is not None and target != name:
                edges.setdefault(target, imp)
        graph[name] = edges
    return graph


def layer_of(name: str) -> int:
    """The rank of a server module's layer: 0 for the top (server/__main__.py)."""
    for rank, layer in enumerate(LAYERS):
        if name == layer or name.startswith(layer + "."):
            return rank
    if name.count(".") <= 1:
        return LAYERS.index("root")
    raise AssertionError(f"{name}: its package has no place in LAYERS (tests/test_architecture.py)")


def cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward_imports(graph: dict[str, dict[str, Import]]) -> list[str]:
    """Each import of a module from a higher layer than its own, described."""
    return [
        f"{src} ({LAYERS[layer_of(src)]}) imports {dst} ({LAYERS[layer_of(dst)]}), line {imp.line}"
        + (" [TYPE_CHECKING]" if imp.type_only else "")
        for src, edges in sorted(graph.items())
        for dst, imp in sorted(edges.items())
        if layer_of(dst) < layer_of(src)
    ]


def _top(target: str) -> str:
    return target.split(".", 1)[0]


# --- the parser itself ---------------------------------------------------------------------


def test_imports_are_found_in_every_form() -> None:
    source = "\n".join(
        [
            "import server.runtime.session",
            "from server import config",
            "from server.runtime.playback import PlaybackBuffer",
            "from . import chunk",
            "from ..avatar import seam",
            "from typing import TYPE_CHECKING",
            "if TYPE_CHECKING:",
            "    from server.rtc.peer import PeerSession",
            "def lazy() -> None:",
            "    import models.asr",
        ]
    )
    known = {
        name: Path()
        for name in (
            "server",
            "server.config",
            "server.avatar.seam",
            "server.rtc.peer",
            "server.runtime.chunk",
            "server.runtime.playback",
            "server.runtime.session",
        )
    }
    found = imports_of(source, "server.runtime.turn")
    resolved = {(resolve(i.target, known), i.type_only) for i in found}
    assert {
        ("server.runtime.session", False),
        ("server.config", False),
        ("server.runtime.playback", False),
        ("server.runtime.chunk", False),
        ("server.avatar.seam", False),
        ("server.rtc.peer", True),
    } <= resolved
    assert "models.asr" in {i.target for i in found}
    assert cycles({"a": {"b": found[0]}, "b": {"a": found[0]}, "c": {"a": found[0]}}) == [
        ["a", "b"]
    ]
    edge = found[0]
    assert upward_imports({"server.runtime.session": {"server.rtc.peer": edge}}) == [
        "server.runtime.session (server.runtime) imports server.rtc.peer (server.rtc), line 1"
    ]
    assert upward_imports({"server.rtc.peer": {"server.runtime.session": edge}}) == []
    assert upward_imports({"server.config": {"server.runtime.session": edge}})
    assert not upward_imports({"server.__main__": {"server.fleet.workers": edge}})


def test_the_graph_is_the_real_one() -> None:
    graph = server_graph()
    assert len(graph) > 50, sorted(graph)
    assert "server.runtime.playback" in graph["server.runtime.session"]
    assert "server.config" in graph["server.runtime.session"]
    for name in graph:
        layer_of(name)  # every package has its place


# --- the rules -----------------------------------------------------------------------------


def test_no_import_cycle_between_server_modules() -> None:
    graph = server_graph()
    found = cycles(graph)
    lines = []
    for component in found:
        members = set(component)
        edges = [
            f"{src} -> {dst} (line {graph[src][dst].line})"
            for src in component
            for dst in sorted(graph[src])
            if dst in members
        ]
        lines.append(" | ".join(component) + ":\n    " + "\n    ".join(edges))
    assert not found, "import cycles between server modules:\n" + "\n".join(lines)


def test_no_module_imports_a_higher_layer() -> None:
    upward = upward_imports(server_graph())
    assert not upward, (
        "upward imports (layers, top to bottom: " + " > ".join(LAYERS) + "):\n" + "\n".join(upward)
    )


def test_package_inits_import_nothing() -> None:
    busy = sorted(
        f"{name} imports {imp.target} (line {imp.line})"
        for name, found in raw_imports().items()
        if server_modules()[name].name == "__init__.py"
        for imp in found
        if _top(imp.target) == "server"
    )
    assert not busy, "package __init__ files that import server modules:\n" + "\n".join(busy)


def test_only_the_composition_root_imports_models() -> None:
    offenders = sorted(
        f"{name} imports {imp.target} (line {imp.line})"
        for name, found in raw_imports().items()
        if name not in MODELS_ALLOWED
        for imp in found
        if _top(imp.target) == "models"
    )
    assert not offenders, (
        "server modules that import models (only "
        + ", ".join(sorted(MODELS_ALLOWED))
        + " may):\n"
        + "\n".join(offenders)
    )


def test_models_import_nothing_from_server() -> None:
    offenders = sorted(
        f"{name} imports {imp.target} (line {imp.line})"
        for name, path in modules_under("models").items()
        for imp in imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
        if _top(imp.target) == "server"
    )
    assert not offenders, (
        "models modules that import server (they know no WebRTC or sessions):\n"
        + ("\n".join(offenders))
    )


def test_server_does_not_import_the_client() -> None:
    offenders = sorted(
        f"{name} imports {imp.target} (line {imp.line})"
        for name, found in raw_imports().items()
        for imp in found
        if _top(imp.target) == "client"
    )
    assert not offenders, "server modules that import the client package:\n" + "\n".join(offenders)


# the packages of the WebRTC transport and its media: server/rtc owns them, server/runtime takes
# plain numbers and arrays (docs/architecture.md, "server/runtime is pure")
WEBRTC_PACKAGES = frozenset({"aiortc", "aioice", "av"})


def test_the_runtime_imports_no_webrtc_or_media_codecs() -> None:
    offenders = sorted(
        f"{name} imports {imp.target} (line {imp.line})"
        + (" [TYPE_CHECKING]" if imp.type_only else "")
        for name, found in raw_imports().items()
        if name == "server.runtime" or name.startswith("server.runtime.")
        for imp in found
        if _top(imp.target) in WEBRTC_PACKAGES
    )
    assert not offenders, (
        "server/runtime modules that import "
        + ", ".join(sorted(WEBRTC_PACKAGES))
        + " (server/rtc owns WebRTC and its media):\n"
        + "\n".join(offenders)
    )


def test_imports_inside_functions_count_for_the_runtime_rule() -> None:
    source = "\n".join(
        [
            "import numpy",
            "def lazy() -> None:",
            "    import av",
            "    from aiortc.mediastreams import MediaStreamError",
            "class Reader:",
            "    async def read(self) -> None:",
            "        from aioice import Connection",
        ]
    )
    tops = {_top(i.target) for i in imports_of(source, "server.runtime.inbound")}
    assert tops >= WEBRTC_PACKAGES
    assert "numpy" in tops
