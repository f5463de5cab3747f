"""models.gguf_meta: a GGUF file's metadata read without its arrays, checked against
``gguf.GGUFReader`` (the reference reader) on files ``gguf.GGUFWriter`` wrote and on the
packaged SmolLM2 model."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from models.gguf_meta import STRING, GgufFormatError, read_gguf_metadata
from models.gguf_models import smollm2_gguf

TOKENS = ["<s>", "</s>", "héllo", "", "wörld", "ünïcode ✓"]
SCALARS: dict[str, tuple[Any, GGUFValueType]] = {
    "test.u8": (200, GGUFValueType.UINT8),
    "test.i8": (-100, GGUFValueType.INT8),
    "test.u16": (60_000, GGUFValueType.UINT16),
    "test.i16": (-30_000, GGUFValueType.INT16),
    "test.u32": (4_000_000_000, GGUFValueType.UINT32),
    "test.i32": (-2_000_000_000, GGUFValueType.INT32),
    "test.f32": (0.5, GGUFValueType.FLOAT32),
    "test.bool": (True, GGUFValueType.BOOL),
    "test.u64": (2**63 + 5, GGUFValueType.UINT64),
    "test.i64": (-(2**62), GGUFValueType.INT64),
    "test.f64": (1.25, GGUFValueType.FLOAT64),
    "test.string": ("a chat template {{ messages }} ✓", GGUFValueType.STRING),
}


def write(path: Path) -> Path:
    """A GGUF file with a value of every scalar type, string, int and float arrays, a nested
    array and one tensor."""
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("Meta Test")
    for key, (value, kind) in SCALARS.items():
        writer.add_key_value(key, value, kind)
    writer.add_array("tokenizer.ggml.tokens", TOKENS)
    writer.add_array("test.ints", [3, 1, 4, 1, 5])
    writer.add_array("test.floats", [0.25, 0.5])
    writer.add_key_value(
        "test.nested", [[1, 2], [3]], GGUFValueType.ARRAY, sub_type=GGUFValueType.ARRAY
    )
    writer.add_uint32("test.after_arrays", 7)
    writer.add_tensor("tok_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference(path: Path) -> dict[str, Any]:
    """Every scalar and string value as GGUFReader reads it."""
    fields = GGUFReader(str(path)).fields
    return {
        key: field.contents()
        for key, field in fields.items()
        if field.types and field.types[0] != GGUFValueType.ARRAY and not key.startswith("GGUF.")
    }


def test_every_value_type_reads_as_the_reference_reader_reads_it(tmp_path: Path) -> None:
    path = write(tmp_path / "meta.gguf")
    meta = read_gguf_metadata(path)
    assert meta.version == 3 and meta.tensor_count == 1
    assert meta.values == reference(path)
    for key, (value, _) in SCALARS.items():
        assert meta.values[key] == pytest.approx(value), key
    assert meta.values["general.name"] == "Meta Test"
    assert meta.values["test.after_arrays"] == 7  # read after stepping over every array
    assert {key: (a.element_type, a.count) for key, a in meta.arrays.items()} == {
        "tokenizer.ggml.tokens": (STRING, len(TOKENS)),
        "test.ints": (GGUFValueType.INT32, 5),
        "test.floats": (GGUFValueType.FLOAT32, 2),
        "test.nested": (GGUFValueType.ARRAY, 2),
    }


def test_strings_are_read_from_an_array_by_index_in_one_pass(tmp_path: Path) -> None:
    meta = read_gguf_metadata(write(tmp_path / "meta.gguf"))
    assert meta.strings_at("tokenizer.ggml.tokens", range(len(TOKENS))) == dict(enumerate(TOKENS))
    assert meta.strings_at("tokenizer.ggml.tokens", [4, 1]) == {1: "</s>", 4: "wörld"}
    assert meta.strings_at("tokenizer.ggml.tokens", [-1, len(TOKENS)]) == {}
    assert meta.strings_at("test.ints", [0]) == {}  # not a string array
    assert meta.strings_at("no.such.key", [0]) == {}


def test_the_packaged_smollm2_model_reads_as_the_reference_reader_reads_it(
    tmp_path: Path,
) -> None:
    path = smollm2_gguf(tmp_path)
    meta = read_gguf_metadata(path)
    assert meta.values == reference(path)
    tokens = GGUFReader(str(path)).fields["tokenizer.ggml.tokens"]
    assert meta.arrays["tokenizer.ggml.tokens"].count == len(tokens.data)
    ids = [0, 1, 2, 1000, len(tokens.data) - 1]
    assert meta.strings_at("tokenizer.ggml.tokens", ids) == {i: tokens.contents(i) for i in ids}


def header(version: int = 3, tensors: int = 0, pairs: int = 1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, pairs)


def key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"GGML" + bytes(40), "not a GGUF file"),
        (b"GGUF", "cut short"),
        (header(version=1), "version 1"),
        (header(version=3 << 24), "version"),  # a big-endian file
        (header(pairs=2) + key("a") + struct.pack("<II", 4, 5), "cut short"),
        (header() + key("a") + struct.pack("<II", 13, 0), "unknown value type 13"),
        (header() + key("a") + struct.pack("<IQ", STRING, 10**6) + b"short", "cut short"),
        (header() + key("a") + struct.pack("<IQ", STRING, 2) + b"\xff\xfe", "not UTF-8"),
        (header() + key("a") + struct.pack("<IIQ", 9, STRING, 3) + key("x"), "cut short"),
    ],
)
def test_a_file_that_is_not_gguf_or_is_cut_short_gets_a_clear_error(
    tmp_path: Path, data: bytes, says: str
) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GgufFormatError, match=says):
        read_gguf_metadata(path)


def test_a_file_cut_inside_its_metadata_is_refused(tmp_path: Path) -> None:
    whole = write(tmp_path / "meta.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    for size in (30, 200, 300):
        cut.write_bytes(whole[:size])
        with pytest.raises(GgufFormatError, match="cut short"):
            read_gguf_metadata(cut)
