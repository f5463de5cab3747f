"""An onnxruntime session whose optimised graph is kept on disk, so that the next start loads it
as it is instead of optimising the model again.

ONNX Runtime optimises a graph when it opens a session (the joe voice: reading and editing the
model with ``onnx`` about 0.5 s, the optimisation about 1 s on a 2-core AVX2/AVX-512 host). It
can write the optimised graph out (``optimized_model_filepath``), and a session on that file
with optimisation turned off starts in about 0.05 s. The optimised graph may hold kernels
chosen for this CPU, so the file's name carries a key of everything it depends on: the source
file (path, size, modification time), what was changed in it before optimising (``variant``),
the onnxruntime version and the CPU's feature flags. A file that will not load is removed and
built again; a folder that cannot be written only costs the saving. One graph is kept per
source file name and part (a graph split in parts keeps each part): building one removes those
of other versions and CPUs.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@functools.cache
def cpu_flags() -> str:
    """The CPU's feature flags as the kernel lists them (Linux), else the platform's name for the
    processor: what decides which kernels onnxruntime picks."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def cache_path(cache_dir: Path, source: Path, variant: str, part: str = "") -> Path:
    """Where the optimised graph of ``source`` (changed as ``variant`` says; ``part``: which
    part of it, "" for the whole) is kept for this onnxruntime and this CPU."""
    import onnxruntime

    stat = source.stat()
    key = "|".join(
        (
            str(source.resolve()),
            str(stat.st_size),
            str(stat.st_mtime_ns),
            variant,
            onnxruntime.__version__,
            cpu_flags(),
        )
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / f"{_stem(source, part)}.{digest}.onnx"


def _stem(source: Path, part: str) -> str:
    return f"{source.stem}.{part}" if part else source.stem


def open_cached_session(
    source: Path,
    build: Callable[[], bytes],
    options: Callable[[], Any],
    *,
    cache_dir: Path | None,
    variant: str = "",
    part: str = "",
) -> Any:
    """A CPU ``onnxruntime.InferenceSession`` of ``source``.

    ``build`` gives the model's bytes as the session should see them (it may change the graph;
    ``variant`` names the change; ``part``: the part of the model it gives, "" for the whole,
    kept under a name of its own). ``options`` makes a fresh ``SessionOptions`` (threads, log
    level) and is called just before each session is made (a process-wide seed set there holds
    for that session). With ``cache_dir`` the optimised graph is loaded from there if it is
    kept, and kept there once built; None: optimised in memory each time. onnxruntime's own
    exceptions pass through (the caller types them)."""
    import onnxruntime

    providers = ["CPUExecutionProvider"]
    if cache_dir is None:
        return onnxruntime.InferenceSession(build(), sess_options=options(), providers=providers)
    kept = cache_path(cache_dir, source, variant, part)
    if kept.exists():
        try:
            session = _open_kept(kept, options)
            log.info("%s: the optimised graph kept in %s", source.name, kept)
            return session
        except Exception as exc:  # onnxruntime raises its own (untyped) exception classes
            log.warning("optimised graph %s will not load (%s); building it again", kept, exc)
            _remove(kept)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("cannot keep optimised graphs in %s (%s)", cache_dir, exc)
        return onnxruntime.InferenceSession(build(), sess_options=options(), providers=providers)
    writing = kept.with_name(f".{kept.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    to_write = options()
    to_write.optimized_model_filepath = str(writing)
    model = build()
    try:
        onnxruntime.InferenceSession(model, sess_options=to_write, providers=providers)
        os.replace(writing, kept)  # whole or not at all, whoever else writes it at once
    except Exception as exc:  # onnxruntime's own (untyped) exceptions, or the file's
        _remove(writing)
        log.warning("cannot keep the optimised graph of %s in %s (%s)", source, cache_dir, exc)
        return onnxruntime.InferenceSession(model, sess_options=options(), providers=providers)
    # one graph kept per source name and part: those of other versions, other CPUs go (the
    # whole's pattern also matches the parts' names, which have one dot more: they stay)
    for stale in cache_dir.glob(f"{_stem(source, part)}.*.onnx"):
        if stale != kept and stale.name.count(".") == kept.name.count("."):
            _remove(stale)
    log.info("kept the optimised graph of %s in %s", source.name, kept)
    # the session runs on the graph as kept, as every later one will: a graph optimised in
    # memory orders its nodes otherwise, and its random kernels draw their seeds in that order
    try:
        return _open_kept(kept, options)
    except Exception as exc:  # gone or replaced meanwhile (another process, another CPU)
        log.warning("optimised graph %s will not load (%s); optimised in memory", kept, exc)
        return onnxruntime.InferenceSession(model, sess_options=options(), providers=providers)


def _open_kept(kept: Path, options: Callable[[], Any]) -> Any:
    """A session on the graph kept in ``kept``, with optimisation off (it was optimised)."""
    import onnxruntime

    as_kept = options()
    as_kept.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(
        str(kept), sess_options=as_kept, providers=["CPUExecutionProvider"]
    )


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot remove %s (%s)", path, exc)
