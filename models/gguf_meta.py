"""The key-value metadata of a GGUF file, read without building its arrays.

GGUF (versions 2 and 3, little-endian): the magic ``GGUF``, a uint32 version, a uint64 tensor
count and a uint64 key-value count, then each pair: a key (a uint64 byte length and UTF-8
bytes), a uint32 value type and the value. A string is a uint64 length and its bytes; an array
is a uint32 element type, a uint64 count and the elements.

``gguf.GGUFReader`` builds a numpy view of every part of every field: 9 s for the 151,665
tokens and 151,387 merges of Qwen2.5's vocabulary on our 2-core test machine, before a server
could say it is ready. This reader keeps the scalars and strings, steps over arrays (a
fixed-size array in one jump, a string array one length at a time) and reads an array's
elements only when asked (:meth:`GgufMetadata.strings_at`).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
STRING, ARRAY = 8, 9  # value types with a length
FIXED = {  # value type -> struct format of one value
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}

Scalar = int | float | bool | str


class GgufFormatError(ValueError):
    """The file is not GGUF (2 or 3, little-endian), or its metadata is cut short or corrupt."""


@dataclass(frozen=True)
class ArrayField:
    """Where an array's elements lie in the file: their type, count and first byte."""

    element_type: int
    count: int
    offset: int


@dataclass(frozen=True)
class GgufMetadata:
    """A GGUF file's header: its scalar and string values, and where its arrays are."""

    path: Path
    version: int
    tensor_count: int
    values: dict[str, Scalar]
    arrays: dict[str, ArrayField]

    def strings_at(self, key: str, indices: Collection[int]) -> dict[int, str]:
        """Elements ``indices`` of the string array ``key``, in one pass up to the last one
        asked for; an index outside the array, or a key that is no string array, is left out."""
        field = self.arrays.get(key)
        if field is None or field.element_type != STRING:
            return {}
        wanted = {i for i in indices if 0 <= i < field.count}
        found: dict[int, str] = {}
        if not wanted:
            return found
        with self.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            cursor = _Cursor(m, field.offset)
            for index in range(max(wanted) + 1):
                if index in wanted:
                    found[index] = cursor.string()
                else:
                    cursor.skip_string()
        return found


class _Cursor:
    """A read position in a mapped file; every read checks that the bytes are there."""

    def __init__(self, data: mmap.mmap, at: int = 0) -> None:
        self.data = data
        self.at = at

    def _take(self, size: int) -> int:
        start = self.at
        if size < 0 or start + size > len(self.data):
            raise GgufFormatError(f"metadata cut short at byte {start} (needs {size} more)")
        self.at = start + size
        return start

    def unpack(self, fmt: str) -> int | float | bool:
        start = self._take(struct.calcsize(fmt))
        value: int | float | bool = struct.unpack_from(fmt, self.data, start)[0]
        return value

    def count(self) -> int:
        return int(self.unpack("<Q"))

    def string(self) -> str:
        size = self.count()
        start = self._take(size)
        try:
            return self.data[start : start + size].decode("utf-8")
        except UnicodeDecodeError as e:
            raise GgufFormatError(f"a string at byte {start} is not UTF-8: {e}") from e

    def skip_string(self) -> None:
        self._take(self.count())

    def value_type(self) -> int:
        kind = int(self.unpack("<I"))
        if kind not in FIXED and kind not in (STRING, ARRAY):
            raise GgufFormatError(f"unknown value type {kind} at byte {self.at - 4}")
        return kind

    def skip(self, kind: int, count: int = 1) -> None:
        """Step over ``count`` values of type ``kind``."""
        if kind in FIXED:
            self._take(struct.calcsize(FIXED[kind]) * count)
        elif kind == STRING:
            for _ in range(count):
                self.skip_string()
        else:
            for _ in range(count):
                inner = self.value_type()
                self.skip(inner, self.count())


def read_gguf_metadata(path: Path) -> GgufMetadata:
    """The metadata of the GGUF file at ``path``; :class:`GgufFormatError` if it is not one,
    OSError if it cannot be read."""
    path = Path(path)
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise GgufFormatError(f"{path} is not a GGUF file (no GGUF magic)")
        if f.seek(0, 2) < 24:
            raise GgufFormatError(f"{path} is cut short: no GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _read(path, _Cursor(m, 4))


def _read(path: Path, cursor: _Cursor) -> GgufMetadata:
    version = int(cursor.unpack("<I"))
    if version not in VERSIONS:
        raise GgufFormatError(
            f"{path}: GGUF version {version} is not read here (only {VERSIONS}, little-endian)"
        )
    tensors, pairs = cursor.count(), cursor.count()
    values: dict[str, Scalar] = {}
    arrays: dict[str, ArrayField] = {}
    for _ in range(pairs):
        key = cursor.string()
        kind = cursor.value_type()
        if kind == STRING:
            values[key] = cursor.string()
        elif kind == ARRAY:
            element, count = cursor.value_type(), cursor.count()
            arrays[key] = ArrayField(element, count, cursor.at)
            cursor.skip(element, count)
        else:
            values[key] = cursor.unpack(FIXED[kind])
    return GgufMetadata(path, version, tensors, values, arrays)
