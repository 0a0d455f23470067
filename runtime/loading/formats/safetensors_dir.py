"""Loader for a Hugging Face checkpoint folder: config.json + safetensors weights.

A safetensors file is: u64 little-endian header length N | N bytes of JSON |
data section. The JSON maps each tensor name to {"dtype", "shape",
"data_offsets": [begin, end]} (offsets relative to the data section), plus an
optional "__metadata__" object of strings. We parse and validate the header
ourselves (every length, offset and size is checked before anything is
trusted), then read tensors by slicing a memory map of the file.

The folder holds either one `model.safetensors` or shards listed in
`model.safetensors.index.json` ({"weight_map": {tensor name: shard file}}).
Which tensors and config keys a model needs is checked by the spec layer.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ember.runtime.loading.formats.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit

# Byte-sized safetensors dtypes -> bytes per element (sub-byte F4/F6 are not supported).
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
    "C64": 8,
}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # what load() turns into float32


@dataclass(frozen=True)
class SafetensorsEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    file_size: int
    metadata: dict[str, str]
    tensors: dict[str, SafetensorsEntry]  # in header order


def _json_object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _is_count(x: Any) -> bool:
    return type(x) is int and x >= 0


def _parse_entry(path: Path, name: str, entry: Any, data_start: int, data_len: int) -> SafetensorsEntry:
    def fail(problem: str) -> CheckpointError:
        return CheckpointError(path, f"tensor {name!r} {problem}")

    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise fail("header entry must be an object with dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise fail(f"has unknown or unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise fail(f"has invalid shape {shape!r}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise fail(f"has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if begin > end:
        raise fail(f"data_offsets {offsets} are out of order (begin after end)")
    if end > data_len:
        raise fail(f"data_offsets {offsets} run past the end of the data section ({data_len} bytes)")
    n_elements = 1
    for d in shape:
        n_elements *= d
    if n_elements * DTYPE_SIZES[dtype] != end - begin:
        raise fail(
            f"shape {shape} of {dtype} needs {n_elements * DTYPE_SIZES[dtype]} bytes "
            f"but data_offsets {offsets} span {end - begin}"
        )
    return SafetensorsEntry(dtype, tuple(shape), data_start + begin, data_start + end)


def read_safetensors_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Parse and validate a safetensors file's header without reading its data."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            if file_size < 8:
                raise CheckpointError(
                    path, f"file of {file_size} bytes is too short for a safetensors header: truncated"
                )
            header_len = int.from_bytes(f.read(8), "little")
            if header_len > file_size - 8:
                raise CheckpointError(
                    path,
                    f"header length {header_len} runs past the end of the file ({file_size} bytes): truncated or corrupt",
                )
            if header_len > MAX_HEADER_BYTES:
                raise CheckpointError(path, f"header length {header_len} is absurd (limit {MAX_HEADER_BYTES})")
            header_bytes = f.read(header_len)
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e.strerror or e}") from e
    try:
        header = json.loads(header_bytes.decode("utf-8"), object_pairs_hook=_json_object_without_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(path, f"header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise CheckpointError(path, "header JSON is not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(path, "__metadata__ must be an object of strings")

    data_start = 8 + header_len
    data_len = file_size - data_start
    tensors = {name: _parse_entry(path, name, entry, data_start, data_len) for name, entry in header.items()}
    _check_no_overlap(path, tensors)
    return SafetensorsHeader(path, file_size, metadata, tensors)


def _check_no_overlap(path: Path, tensors: dict[str, SafetensorsEntry]) -> None:
    by_start = sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end))
    for (prev_name, prev), (name, cur) in zip(by_start, by_start[1:]):
        if cur.begin < prev.end:
            raise CheckpointError(
                path,
                f"tensors {prev_name!r} and {name!r} overlap "
                f"(bytes {prev.begin}..{prev.end} and {cur.begin}..{cur.end})",
            )


def _read_json_object(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise CheckpointError(path, "missing (a Hugging Face checkpoint folder needs it)")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(path, f"not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise CheckpointError(path, "must hold a JSON object")
    return value


def _bf16_to_f32(data: np.ndarray) -> np.ndarray:
    return (data.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)


@dataclass(frozen=True)
class HFCheckpoint:
    path: Path
    config: dict
    generation_config: dict  # {} when the folder has no generation_config.json
    tensor_names: tuple[str, ...]
    # tensor name -> (shard header, entry); shard path -> memory map (opened on first load)
    _locations: dict[str, tuple[SafetensorsHeader, SafetensorsEntry]] = field(
        repr=False, compare=False, default_factory=dict
    )
    _maps: dict[Path, mmap.mmap] = field(repr=False, compare=False, default_factory=dict)
    # the loader reads tensors from several threads (runtime/loading/weights.py prefetched): one map per shard
    _maps_lock: threading.Lock = field(repr=False, compare=False, default_factory=threading.Lock)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape from the header, without reading its data."""
        return tuple(self.entry(name).shape)

    def entry(self, name: str) -> SafetensorsEntry:
        """The stored dtype, shape and byte range of a tensor."""
        if name not in self._locations:
            raise CheckpointError(self.path, f"no tensor named {name!r}")
        return self._locations[name][1]

    def load(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array (stored as F32, F16, BF16 or F64)."""
        header, entry = self._locations.get(name, (None, None))
        if header is None or entry is None:
            raise CheckpointError(self.path, f"no tensor named {name!r}")
        if entry.dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                header.path,
                f"tensor {name!r} has dtype {entry.dtype}, which does not "
                f"load as float32 (supported: {', '.join(FLOAT_DTYPES)})",
            )
        data = np.frombuffer(self._map(header), np.uint8, entry.end - entry.begin, entry.begin)
        if entry.dtype == "BF16":
            values = _bf16_to_f32(data)
        else:
            values = data.view({"F32": "<f4", "F16": "<f2", "F64": "<f8"}[entry.dtype]).astype(np.float32)
        return values.reshape(entry.shape)

    def load_fp8(self, name: str) -> np.ndarray:
        """An F8_E4M3 tensor's stored values (float8_e4m3fn, a copy), unscaled: runtime/loading/fp8_checkpoint.py pairs
        them with their scales."""
        header, entry = self._locations.get(name, (None, None))
        if header is None or entry is None:
            raise CheckpointError(self.path, f"no tensor named {name!r}")
        if entry.dtype != "F8_E4M3":
            raise CheckpointError(header.path, f"tensor {name!r} has dtype {entry.dtype}, not F8_E4M3")
        data = np.frombuffer(self._map(header), np.uint8, entry.end - entry.begin, entry.begin)
        return data.view(ml_dtypes.float8_e4m3fn).reshape(entry.shape).copy()

    def load_u8(self, name: str) -> np.ndarray:
        """A U8 tensor's stored bytes (uint8, a copy): NVFP4's packed codes (runtime/loading/nvfp4_checkpoint.py)."""
        header, entry = self._locations.get(name, (None, None))
        if header is None or entry is None:
            raise CheckpointError(self.path, f"no tensor named {name!r}")
        if entry.dtype != "U8":
            raise CheckpointError(header.path, f"tensor {name!r} has dtype {entry.dtype}, not U8")
        return (
            np.frombuffer(self._map(header), np.uint8, entry.end - entry.begin, entry.begin).reshape(entry.shape).copy()
        )

    def close(self) -> None:
        """Release the shard memory maps (a later load() maps them again)."""
        for mapped in self._maps.values():
            try:
                mapped.close()
            except BufferError:
                pass  # an array still views it; unmapped when that array goes
        self._maps.clear()

    def _map(self, header: SafetensorsHeader) -> mmap.mmap:
        with self._maps_lock:
            mapped = self._maps.get(header.path)
            if mapped is None:
                try:
                    with open(header.path, "rb") as f:
                        if os.fstat(f.fileno()).st_size != header.file_size:
                            raise CheckpointError(header.path, "file changed size since the checkpoint was opened")
                        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                except OSError as e:
                    raise CheckpointError(header.path, f"cannot map: {e.strerror or e}") from e
                self._maps[header.path] = mapped
            return mapped


def _shard_headers_from_index(folder: Path) -> list[tuple[str, SafetensorsHeader]]:
    index_path = folder / INDEX_FILE
    index = _read_json_object(index_path, required=True)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(index_path, "has no weight_map object naming the shards")
    headers: dict[str, SafetensorsHeader] = {}
    placed = []
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise CheckpointError(
                index_path, f"tensor {name!r} names shard {shard!r}, which is not a file name in the folder"
            )
        if shard not in headers:
            if not (folder / shard).is_file():
                raise CheckpointError(index_path, f"names shard {shard!r}, which is missing from {folder}")
            headers[shard] = read_safetensors_header(folder / shard)
        if name not in headers[shard].tensors:
            raise CheckpointError(folder / shard, f"has no tensor {name!r}, which {INDEX_FILE} places there")
        placed.append((name, headers[shard]))
    return placed


def open_hf_checkpoint(path: str | os.PathLike[str]) -> HFCheckpoint:
    """Open a Hugging Face checkpoint folder; only headers are read until load()."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(folder, "not a directory (expected a Hugging Face checkpoint folder)")
    config = _read_json_object(folder / "config.json", required=True)
    generation_config = _read_json_object(folder / "generation_config.json", required=False)

    if (folder / SINGLE_FILE).is_file():
        header = read_safetensors_header(folder / SINGLE_FILE)
        placed = [(name, header) for name in header.tensors]
    elif (folder / INDEX_FILE).is_file():
        placed = _shard_headers_from_index(folder)
    else:
        raise CheckpointError(folder, f"has neither {SINGLE_FILE} nor {INDEX_FILE}")
    locations = {name: (header, header.tensors[name]) for name, header in placed}
    return HFCheckpoint(folder, config, generation_config, tuple(locations), locations)
