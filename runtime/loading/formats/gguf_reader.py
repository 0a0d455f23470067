"""Ember's own reader for GGUF v2/v3 files (llama.cpp's checkpoint format).

Layout of a GGUF file (all little-endian):

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x   (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, u64 dims[n_dims] (ggml order, innermost first),
                    u32 ggml_type, u64 offset relative to the data section)
    padding to `general.alignment` (default 32) | data section

where a string is (u64 byte length, UTF-8 bytes) and an array value is
(u32 element type, u64 count, elements). The file is memory-mapped and never
read whole: only the header is parsed at open time, and every count or length
in it is checked against the bytes left in the file before anything is
allocated, so a corrupt or hostile file fails fast with a `CheckpointError`.

Metadata values are plain Python: int, float, bool, str, and list for arrays
(numeric arrays become lists of Python numbers, string arrays list[str], nested
arrays nested lists). Strings that are not valid UTF-8 are decoded with
`surrogateescape`, so `s.encode("utf-8", "surrogateescape")` gives back the
exact bytes.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ember.runtime.loading.formats.dequant import SUPPORTED_TYPES, dequantize, supported_type_names
from ember.runtime.loading.formats.errors import CheckpointError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8  # arrays of arrays deeper than this are not real metadata
MAX_ELEMENTS = 1 << 60  # a product of dims above this is overflow, not a tensor

_STRING, _ARRAY = 8, 9
# metadata value type -> numpy dtype of one element (bool is stored as one byte)
_SCALAR_DTYPES: dict[int, str] = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_BOOL = 7
# The fewest bytes one value of each type can take: bounds how many fit in the file.
_MIN_VALUE_BYTES = {**{t: np.dtype(d).itemsize for t, d in _SCALAR_DTYPES.items()}, _STRING: 8, _ARRAY: 12}
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: ggml's dims reversed, so rows are shape[0]
    ggml_type: int
    type_name: str
    offset: int  # absolute byte offset of the tensor's data in the file
    nbytes: int


def _decode(data: bytes) -> str:
    return str(data, "utf-8", "surrogateescape")


class _HeaderCursor:
    """Reads header fields in order; every read is checked against the end of the file."""

    def __init__(self, buf: mmap.mmap, size: int, path: Path):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def error(self, problem: str) -> CheckpointError:
        return CheckpointError(self.path, problem)

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        """Advance past n bytes and return where they start."""
        if n > self.size - self.pos:
            raise self.error(
                f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes): the file is truncated"
            )
        start = self.pos
        self.pos += n
        return start

    def scalar(self, value_type: int, what: str) -> Any:
        dtype = np.dtype(_SCALAR_DTYPES[value_type])
        start = self.take(dtype.itemsize, what)
        value = np.frombuffer(self.buf, dtype, 1, start)[0].item()
        return bool(value) if value_type == _BOOL else value

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def count(self, what: str, min_bytes_each: int) -> int:
        """A u64 count of items that must each still fit in the rest of the file."""
        n = self.u64(what)
        if n * min_bytes_each > self.remaining():
            raise self.error(
                f"{what} is {n}, more than the {self.remaining()} bytes left "
                f"in the file could hold: the header is corrupt"
            )
        return n

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        if n > self.remaining():
            raise self.error(
                f"{what} claims {n} bytes, past the end of the file "
                f"({self.remaining()} bytes left): truncated or corrupt"
            )
        start = self.take(n, what)
        return _decode(self.buf[start : start + n])

    def strings(self, n: int, what: str) -> list[str]:
        # The hot loop of opening a model (150k-260k vocabulary strings): kept lean.
        buf, size, pos, out = self.buf, self.size, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        for i in range(n):
            if pos + 8 > size or (length := unpack(buf, pos)[0]) > size - pos - 8:
                self.pos = pos
                raise self.error(
                    f"{what}[{i}] at byte {pos} runs past the end of the file ({size} bytes): truncated or corrupt"
                )
            pos += 8
            out.append(_decode(buf[pos : pos + length]))
            pos += length
        self.pos = pos
        return out

    def value(self, value_type: int, what: str, depth: int = 0) -> Any:
        if value_type in _SCALAR_DTYPES:
            return self.scalar(value_type, what)
        if value_type == _STRING:
            return self.string(what)
        if value_type != _ARRAY:
            raise self.error(f"{what} has unknown metadata value type {value_type}")
        if depth >= MAX_ARRAY_NESTING:
            raise self.error(f"{what} nests arrays more than {MAX_ARRAY_NESTING} deep")
        elem_type = self.u32(f"element type of {what}")
        if elem_type not in _MIN_VALUE_BYTES:
            raise self.error(f"{what} is an array of unknown metadata value type {elem_type}")
        n = self.count(f"element count of {what}", _MIN_VALUE_BYTES[elem_type])
        if elem_type in _SCALAR_DTYPES:
            dtype = np.dtype(_SCALAR_DTYPES[elem_type])
            start = self.take(n * dtype.itemsize, what)
            values = np.frombuffer(self.buf, dtype, n, start)
            return (values != 0).tolist() if elem_type == _BOOL else values.tolist()
        if elem_type == _STRING:
            return self.strings(n, what)
        return [self.value(elem_type, f"{what}[{i}]", depth + 1) for i in range(n)]


def _ggml_type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"unknown type {ggml_type}"


def _map_file(path: Path) -> tuple[mmap.mmap, int]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise CheckpointError(path, "the file is empty (truncated download?)")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size
    except OSError as e:
        raise CheckpointError(path, f"cannot open: {e.strerror or e}") from e


class GGUFFile:
    """A memory-mapped GGUF checkpoint: metadata, tensor directory, tensor loads.

    `metadata` maps keys to plain Python values (arrays become lists, see the
    module docstring); `tensors` maps names to GGUFTensorInfo in file order.

    With `require_supported=True` (the default) opening fails, listing every
    tensor whose quant type Ember cannot dequantize. Pass False to inspect the
    metadata of such a file; loading one of those tensors then fails instead.
    """

    def __init__(self, path: str | os.PathLike[str], *, require_supported: bool = True):
        self.path = Path(path)
        self._mmap, self.file_size = _map_file(self.path)
        try:
            self._parse()
        except BaseException:
            self.close()
            raise
        if require_supported and self.unsupported_tensors:
            self.close()
            raise CheckpointError(self.path, self._unsupported_message())

    # -- parsing ------------------------------------------------------------------

    def _parse(self) -> None:
        cur = _HeaderCursor(self._mmap, self.file_size, self.path)
        magic = self._mmap[0:4]
        cur.take(4, "the GGUF magic")
        if magic != GGUF_MAGIC:
            raise cur.error(f"bad magic {magic!r}: not a GGUF file (expected {GGUF_MAGIC!r})")
        self.version = cur.u32("the GGUF version")
        self._check_version(cur)
        n_tensors = cur.count("tensor count", _MIN_TENSOR_INFO_BYTES)
        n_kv = cur.count("metadata key/value count", _MIN_KV_BYTES)

        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"key of metadata entry #{i}")
            if key in self.metadata:
                raise cur.error(f"duplicate metadata key {key!r}")
            value_type = cur.u32(f"value type of metadata {key!r}")
            self.metadata[key] = cur.value(value_type, f"metadata {key!r}")
        self.alignment = self._read_alignment(cur)

        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        # The data section starts at the first aligned byte after the header.
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, GGUFTensorInfo] = {}
        for name, dims, ggml_type, rel_offset in infos:
            if name in self.tensors:
                raise cur.error(f"duplicate tensor name {name!r}")
            self.tensors[name] = self._validated_tensor(name, dims, ggml_type, rel_offset)
        self.unsupported_tensors = {
            n: t.type_name for n, t in self.tensors.items() if t.ggml_type not in SUPPORTED_TYPES
        }

    def _check_version(self, cur: _HeaderCursor) -> None:
        if self.version in SUPPORTED_VERSIONS:
            return
        swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS:
            raise cur.error(f"big-endian GGUF (version {swapped}) is not supported")
        raise cur.error(
            f"unsupported GGUF version {self.version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})"
        )

    def _read_alignment(self, cur: _HeaderCursor) -> int:
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise cur.error(f"general.alignment is {alignment!r}, not a positive power of two")
        return alignment

    def _read_tensor_info(self, cur: _HeaderCursor, index: int) -> tuple[str, list[int], int, int]:
        name = cur.string(f"name of tensor #{index}")
        n_dims = cur.u32(f"dimension count of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.error(f"tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
        dims = [cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
        ggml_type = cur.u32(f"type of tensor {name!r}")
        rel_offset = cur.u64(f"data offset of tensor {name!r}")
        return name, dims, ggml_type, rel_offset

    def _validated_tensor(self, name: str, dims: list[int], ggml_type: int, rel_offset: int) -> GGUFTensorInfo:
        def fail(problem: str) -> CheckpointError:
            return CheckpointError(self.path, f"tensor {name!r} {problem}")

        if ggml_type not in GGML_QUANT_SIZES:
            raise fail(f"has unknown ggml type {ggml_type}")
        type_name = _ggml_type_name(ggml_type)
        n_elements = 1
        for d in dims:
            n_elements *= d
            if n_elements > MAX_ELEMENTS:
                raise fail(f"has dims {dims} whose element count overflows")
        block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        if dims[0] % block_elems:
            raise fail(f"has rows of {dims[0]} elements, not a multiple of the {type_name} block size {block_elems}")
        nbytes = n_elements // block_elems * block_bytes
        if rel_offset % self.alignment:
            raise fail(f"data offset {rel_offset} is not aligned to {self.alignment} bytes")
        start = self.data_offset + rel_offset
        if start + nbytes > self.file_size:
            raise fail(
                f"data (bytes {start}..{start + nbytes}) runs past the end of the file "
                f"({self.file_size} bytes): truncated or corrupt"
            )
        return GGUFTensorInfo(name, tuple(reversed(dims)), ggml_type, type_name, start, nbytes)

    def _unsupported_message(self) -> str:
        listed = [
            f"{n} has unsupported type {t} ({int(GGMLQuantizationType[t])})"
            for n, t in list(self.unsupported_tensors.items())[:5]
        ]
        more = len(self.unsupported_tensors) - len(listed)
        return (
            f"{len(self.unsupported_tensors)} tensor(s) of unsupported types: "
            f"{'; '.join(listed)}{f'; and {more} more' if more else ''}; "
            f"supported: {supported_type_names()}"
        )

    # -- access -------------------------------------------------------------------

    def _info(self, name: str) -> GGUFTensorInfo:
        if self._mmap is None:
            raise CheckpointError(self.path, "the file has been closed")
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError(self.path, f"no tensor named {name!r}")
        return info

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the memory map (no copy)."""
        info = self._info(name)
        return np.frombuffer(self._mmap, np.uint8, info.nbytes, info.offset)

    def load(self, name: str) -> np.ndarray:
        """The tensor dequantized to a new float32 array of shape `info.shape`."""
        info = self._info(name)
        if info.ggml_type not in SUPPORTED_TYPES:
            raise CheckpointError(
                self.path,
                f"tensor {name} has unsupported type {info.type_name} "
                f"({info.ggml_type}); supported: {supported_type_names()}",
            )
        return dequantize(self.raw(name), info.ggml_type, info.shape)

    def close(self) -> None:
        """Release the memory map (arrays from raw() keep it alive until they go)."""
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # raw() views still use it; it is unmapped when they are freed
            self._mmap = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, version={self.version}, tensors={len(self.tensors)})"
