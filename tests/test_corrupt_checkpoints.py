"""Corrupt, truncated and lying checkpoints must fail with a CheckpointError naming the
file and the problem, without a large allocation (checked with tracemalloc) or a hang."""

from __future__ import annotations

import json
import re
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_test_data import random_tensor_bytes, write_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from ember.runtime.loading.formats.errors import CheckpointError
from ember.runtime.loading.formats.gguf_reader import GGUFFile
from ember.runtime.loading.formats.safetensors_dir import read_safetensors_header

Q = gguf.GGMLQuantizationType
V = gguf.GGUFValueType
PEAK_BYTES_LIMIT = 2 * 1024 * 1024  # rejecting a few-KB file must not allocate more than this


def assert_rejected(open_file: Callable[[Path], object], path: Path, problem: str) -> CheckpointError:
    """open_file(path) raises CheckpointError '<path>: <problem matching regex>' cheaply."""
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as excinfo:
            open_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = excinfo.value
    assert str(error).startswith(f"{path}: "), str(error)
    assert re.search(problem, error.problem), f"{error.problem!r} does not match {problem!r}"
    assert peak < PEAK_BYTES_LIMIT, f"rejecting {path.name} allocated {peak} bytes"
    return error


# -- GGUF -----------------------------------------------------------------------------


class GGUFLayout:
    """A tiny valid GGUF file and where its fields sit, as located by gguf's own reader."""

    def __init__(self, path: Path):
        rng = np.random.default_rng(3)
        tensors = {
            "w.a": (Q.Q8_0, random_tensor_bytes(rng, Q.Q8_0, 64), (2, 32)),
            "w.b": (Q.F32, random_tensor_bytes(rng, Q.F32, 8), (8,)),
            "w.c": (Q.Q4_K, random_tensor_bytes(rng, Q.Q4_K, 256), (1, 256)),
        }
        metadata = {
            "general.alignment": (32, V.UINT32),
            "t.aa": (7, V.UINT32),
            "t.bb": (8, V.UINT32),
            "tokenizer.ggml.tokens": (["<s>", "hello", "Ġworld"], V.ARRAY, V.STRING),
        }
        self.path = write_gguf(path, tensors, metadata)
        self.data = self.path.read_bytes()
        reader = gguf.GGUFReader(self.path)
        self.fields = reader.fields
        self.tensor_fields = {t.name: t.field for t in reader.tensors}
        self.data_end = max(t.data_offset + int(t.n_bytes) for t in reader.tensors)

    @staticmethod
    def part_offset(field: gguf.ReaderField, part: int) -> int:
        return field.offset + sum(p.nbytes for p in field.parts[:part])

    def kv_part(self, key: str, part: int) -> int:
        # kv parts: 0 key length, 1 key bytes, 2 value type, 3... the value
        return self.part_offset(self.fields[key], part)

    def tensor_part(self, name: str, part: int) -> int:
        # tensor info parts: 0 name length, 1 name bytes, 2 n_dims, 3 dims, 4 type, 5 offset
        return self.part_offset(self.tensor_fields[name], part)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> GGUFLayout:
    return GGUFLayout(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_the_pristine_file_opens(layout: GGUFLayout) -> None:
    with GGUFFile(layout.path) as f:
        assert list(f.tensors) == ["w.a", "w.b", "w.c"]
        assert f.load("w.c").shape == (1, 256)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0))
def test_truncation_anywhere_before_the_last_tensor_byte_is_caught(
    layout: GGUFLayout, tmp_path: Path, cut: int
) -> None:
    cut %= layout.data_end
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(layout.data[:cut])
    assert_rejected(GGUFFile, truncated, r"truncated|past the end of the file|empty|could hold")


def test_trailing_padding_may_be_cut(layout: GGUFLayout, tmp_path: Path) -> None:
    trimmed = tmp_path / "trimmed.gguf"
    trimmed.write_bytes(layout.data[: layout.data_end])
    with GGUFFile(trimmed) as f:
        assert f.load("w.c").shape == (1, 256)


def put(fmt: str, value: int) -> Callable[[bytearray, int], None]:
    def write(data: bytearray, offset: int) -> None:
        struct.pack_into(fmt, data, offset, value)

    return write


# (name, where to patch: layout -> byte offset, what to write, expected problem regex)
GGUF_PATCHES = [
    ("bad magic", lambda l: 0, lambda d, o: d.__setitem__(slice(0, 4), b"GGML"), r"bad magic b'GGML'.*not a GGUF file"),
    ("version 1", lambda l: 4, put("<I", 1), r"unsupported GGUF version 1 \(supported: 2, 3\)"),
    ("version 99", lambda l: 4, put("<I", 99), r"unsupported GGUF version 99"),
    ("big-endian", lambda l: 4, put(">I", 3), r"big-endian GGUF \(version 3\) is not supported"),
    ("huge tensor count", lambda l: 8, put("<Q", 2**63), r"tensor count is 9223372036854775808, more than"),
    ("too many tensors", lambda l: 8, put("<Q", 10**6), r"tensor count is 1000000, more than the \d+ bytes left"),
    ("huge kv count", lambda l: 16, put("<Q", 2**64 - 1), r"metadata key/value count is \d+, more than"),
    (
        "huge key length",
        lambda l: l.kv_part("t.aa", 0),
        put("<Q", 2**62),
        r"key of metadata entry #\d claims \d+ bytes, past the end",
    ),
    (
        "huge string value",
        lambda l: l.kv_part("general.architecture", 3),
        put("<Q", 2**40),
        r"metadata 'general.architecture' claims 1099511627776 bytes, past the end",
    ),
    (
        "huge array count",
        lambda l: l.kv_part("tokenizer.ggml.tokens", 4),
        put("<Q", 2**61),
        r"element count of metadata 'tokenizer.ggml.tokens' is \d+, more than",
    ),
    (
        "array string too long",
        lambda l: l.kv_part("tokenizer.ggml.tokens", 7),
        put("<Q", 10**9),
        r"metadata 'tokenizer.ggml.tokens'\[1\] .* past the end of the file",
    ),
    (
        "unknown value type",
        lambda l: l.kv_part("t.aa", 2),
        put("<I", 13),
        r"metadata 't.aa' has unknown metadata value type 13",
    ),
    (
        "unknown element type",
        lambda l: l.kv_part("tokenizer.ggml.tokens", 3),
        put("<I", 77),
        r"array of unknown metadata value type 77",
    ),
    (
        "duplicate key",
        lambda l: l.kv_part("t.bb", 1),
        lambda d, o: d.__setitem__(slice(o, o + 4), b"t.aa"),
        r"duplicate metadata key 't.aa'",
    ),
    (
        "zero alignment",
        lambda l: l.kv_part("general.alignment", 3),
        put("<I", 0),
        r"general.alignment is 0, not a positive power of two",
    ),
    ("odd alignment", lambda l: l.kv_part("general.alignment", 3), put("<I", 48), r"general.alignment is 48"),
    (
        "five dims",
        lambda l: l.tensor_part("w.a", 2),
        put("<I", 5),
        r"tensor 'w.a' has 5 dimensions \(GGUF allows 1 to 4\)",
    ),
    ("zero dims", lambda l: l.tensor_part("w.a", 2), put("<I", 0), r"tensor 'w.a' has 0 dimensions"),
    ("absurd dims", lambda l: l.tensor_part("w.a", 2), put("<I", 2**32 - 1), r"tensor 'w.a' has 4294967295 dimensions"),
    (
        "overflowing dims",
        lambda l: l.tensor_part("w.a", 3),
        lambda d, o: struct.pack_into("<QQ", d, o, 2**40, 2**40),
        r"tensor 'w.a' has dims \[\d+, \d+\] whose element count overflows",
    ),
    (
        "dim past EOF",
        lambda l: l.tensor_part("w.a", 3) + 8,
        put("<Q", 10**6),
        r"tensor 'w.a' data \(bytes \d+\.\.\d+\) runs past the end of the file",
    ),
    (
        "row not whole blocks",
        lambda l: l.tensor_part("w.a", 3),
        put("<Q", 33),
        r"tensor 'w.a' has rows of 33 elements, not a multiple of the Q8_0 block size 32",
    ),
    ("unknown ggml type", lambda l: l.tensor_part("w.b", 4), put("<I", 99), r"tensor 'w.b' has unknown ggml type 99"),
    (
        "offset past EOF",
        lambda l: l.tensor_part("w.c", 5),
        put("<Q", 2**40),
        r"tensor 'w.c' data .* runs past the end of the file",
    ),
    (
        "misaligned offset",
        lambda l: l.tensor_part("w.c", 5),
        lambda d, o: struct.pack_into("<Q", d, o, struct.unpack_from("<Q", d, o)[0] + 4),
        r"tensor 'w.c' data offset \d+ is not aligned to 32 bytes",
    ),
    (
        "duplicate tensor",
        lambda l: l.tensor_part("w.b", 1),
        lambda d, o: d.__setitem__(slice(o, o + 3), b"w.a"),
        r"duplicate tensor name 'w.a'",
    ),
    (
        "huge tensor name",
        lambda l: l.tensor_part("w.b", 0),
        put("<Q", 2**63),
        r"name of tensor #1 claims \d+ bytes, past the end",
    ),
]


@pytest.mark.parametrize("where, patch, problem", [p[1:] for p in GGUF_PATCHES], ids=[p[0] for p in GGUF_PATCHES])
def test_corrupt_gguf_header_is_rejected(layout: GGUFLayout, tmp_path: Path, where, patch, problem: str) -> None:
    data = bytearray(layout.data)
    patch(data, where(layout))
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(data)
    assert_rejected(GGUFFile, corrupt, problem)


def test_arrays_nested_absurdly_deep_are_rejected(tmp_path: Path) -> None:
    deep: list = [1]
    for _ in range(11):
        deep = [deep]
    path = write_gguf(tmp_path / "deep.gguf", {}, {"t.deep": (deep, V.ARRAY, V.ARRAY)})
    assert_rejected(GGUFFile, path, r"nests arrays more than 8 deep")


def test_empty_and_missing_files_are_rejected(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_rejected(GGUFFile, empty, r"the file is empty")
    assert_rejected(GGUFFile, tmp_path / "absent.gguf", r"cannot open: No such file")


# -- safetensors ----------------------------------------------------------------------


def write_safetensors(path: Path, header: object, data: bytes, *, header_len: int | None = None) -> Path:
    """A safetensors file with whatever header we like (possibly lying)."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(header_bytes) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", length) + header_bytes + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_valid_crafted_header_is_accepted(tmp_path: Path) -> None:
    header = {"__metadata__": {"format": "pt"}, "a": entry("F32", [2, 2], 0, 16), "b": entry("BF16", [3], 16, 22)}
    parsed = read_safetensors_header(write_safetensors(tmp_path / "ok.safetensors", header, bytes(22)))
    assert parsed.metadata == {"format": "pt"} and list(parsed.tensors) == ["a", "b"]


SAFETENSORS_LIES = [
    (
        "header length past EOF",
        {"a": entry("F32", [1], 0, 4)},
        4,
        10**6,
        r"header length 1000000 runs past the end of the file",
    ),
    ("header not JSON", b"{not json", 0, None, r"header is not valid JSON"),
    ("header not UTF-8", b'{"\xff": 1}', 0, None, r"header is not valid JSON"),
    ("header is a list", [1, 2], 0, None, r"header JSON is not an object"),
    (
        "duplicate names",
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
        8,
        None,
        r"duplicate key 'a'",
    ),
    ("metadata not strings", {"__metadata__": {"x": 1}}, 0, None, r"__metadata__ must be an object of strings"),
    ("entry not an object", {"a": [1, 2]}, 0, None, r"tensor 'a' header entry must be an object"),
    ("unknown dtype", {"a": entry("F7", [1], 0, 4)}, 4, None, r"tensor 'a' has unknown or unsupported dtype 'F7'"),
    ("negative dim", {"a": entry("F32", [-1], 0, 4)}, 4, None, r"tensor 'a' has invalid shape \[-1\]"),
    ("boolean dim", {"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, 4, None, r"invalid shape"),
    (
        "three offsets",
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}},
        8,
        None,
        r"invalid data_offsets",
    ),
    (
        "size mismatch",
        {"a": entry("F32", [3], 0, 8)},
        8,
        None,
        r"shape \[3\] of F32 needs 12 bytes but data_offsets \[0, 8\] span 8",
    ),
    (
        "offsets past data",
        {"a": entry("F32", [4], 0, 16)},
        8,
        None,
        r"data_offsets \[0, 16\] run past the end of the data section \(8 bytes\)",
    ),
    ("offsets reversed", {"a": entry("F32", [1], 8, 4)}, 8, None, r"data_offsets \[8, 4\] are out of order"),
    (
        "overlap",
        {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)},
        12,
        None,
        r"tensors 'a' and 'b' overlap",
    ),
]


@pytest.mark.parametrize(
    "header, data_len, header_len, problem", [l[1:] for l in SAFETENSORS_LIES], ids=[l[0] for l in SAFETENSORS_LIES]
)
def test_lying_safetensors_header_is_rejected(tmp_path: Path, header, data_len: int, header_len, problem: str) -> None:
    path = write_safetensors(tmp_path / "lie.safetensors", header, bytes(data_len), header_len=header_len)
    assert_rejected(read_safetensors_header, path, problem)


def test_absurd_header_length_in_a_big_sparse_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "sparse.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 200 * 1024 * 1024))
        f.truncate(300 * 1024 * 1024)  # sparse: no disk or memory used
    assert_rejected(read_safetensors_header, path, r"header length 209715200 is absurd")


def test_tiny_safetensors_files_are_rejected(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    assert_rejected(read_safetensors_header, short, r"too short for a safetensors header: truncated")


@pytest.fixture(scope="module")
def valid_safetensors(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    save_file({"a": np.ones((3, 5), np.float32), "b": np.arange(7, dtype=np.float16)}, str(path))
    return path.read_bytes()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0))
def test_truncated_safetensors_is_rejected_anywhere(valid_safetensors: bytes, tmp_path: Path, cut: int) -> None:
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(valid_safetensors[: cut % len(valid_safetensors)])
    assert_rejected(read_safetensors_header, truncated, r"truncated|past the end|not valid JSON")
