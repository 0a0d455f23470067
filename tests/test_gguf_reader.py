"""GGUFFile against files written by gguf's GGUFWriter and read back by gguf's GGUFReader."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_test_data import assert_bitwise_equal, random_tensor_bytes, write_gguf

from ember.runtime.loading.formats.errors import CheckpointError
from ember.runtime.loading.formats.gguf_reader import GGUFFile, GGUFTensorInfo

Q = gguf.GGMLQuantizationType
V = gguf.GGUFValueType

# name -> (type, numpy shape): every supported type, 1-D to 3-D, rows of several blocks.
TENSOR_LAYOUT: dict[str, tuple[int, tuple[int, ...]]] = {
    "norm.weight": (Q.F32, (24,)),
    "f16.weight": (Q.F16, (3, 10)),
    "bf16.weight": (Q.BF16, (2, 2, 8)),
    "blk.0.q8_0.weight": (Q.Q8_0, (5, 64)),
    "blk.0.q4_0.weight": (Q.Q4_0, (3, 96)),
    "blk.0.q5_0.weight": (Q.Q5_0, (2, 32)),
    "blk.1.q4_k.weight": (Q.Q4_K, (3, 512)),
    "blk.1.q5_k.weight": (Q.Q5_K, (2, 256)),
    "blk.1.q6_k.weight": (Q.Q6_K, (2, 2, 256)),
}

METADATA = {
    "t.u8": (200, V.UINT8),
    "t.i8": (-100, V.INT8),
    "t.u16": (60000, V.UINT16),
    "t.i16": (-30000, V.INT16),
    "t.u32": (4_000_000_000, V.UINT32),
    "t.i32": (-2_000_000_000, V.INT32),
    "t.f32": (0.1, V.FLOAT32),
    "t.bool": (True, V.BOOL),
    "t.string": ("héllo ✓", V.STRING),
    "t.u64": (2**63 + 5, V.UINT64),
    "t.i64": (-(2**62), V.INT64),
    "t.f64": (0.1, V.FLOAT64),
    "t.strings": (["a", "", "<0xFF>", "Ġthe"], V.ARRAY, V.STRING),
    "t.ints": ([1, -2, 3], V.ARRAY, V.INT32),
    "t.floats": ([0.5, -1.25], V.ARRAY, V.FLOAT32),
    "t.bools": ([True, False, True], V.ARRAY, V.BOOL),
    "t.u64s": ([2**64 - 1, 0], V.ARRAY, V.UINT64),
    "t.nested": ([[1, 2], [3]], V.ARRAY, V.ARRAY),
}
EXPECTED_METADATA = {
    "general.architecture": "tiny",
    "t.u8": 200,
    "t.i8": -100,
    "t.u16": 60000,
    "t.i16": -30000,
    "t.u32": 4_000_000_000,
    "t.i32": -2_000_000_000,
    "t.f32": float(np.float32(0.1)),
    "t.bool": True,
    "t.string": "héllo ✓",
    "t.u64": 2**63 + 5,
    "t.i64": -(2**62),
    "t.f64": 0.1,
    "t.strings": ["a", "", "<0xFF>", "Ġthe"],
    "t.ints": [1, -2, 3],
    "t.floats": [0.5, -1.25],
    "t.bools": [True, False, True],
    "t.u64s": [2**64 - 1, 0],
    "t.nested": [[1, 2], [3]],
}


def write_tiny_model(path: Path, *, alignment: int | None = None, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    tensors = {
        name: (t, random_tensor_bytes(rng, t, int(np.prod(shape))), shape) for name, (t, shape) in TENSOR_LAYOUT.items()
    }
    return write_gguf(path, tensors, METADATA, alignment=alignment)


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny.gguf")


def test_metadata_values_are_plain_python(tiny_model: Path) -> None:
    with GGUFFile(tiny_model) as f:
        assert f.version == 3
        assert f.metadata == EXPECTED_METADATA
        assert [type(f.metadata[k]) for k in ("t.u64", "t.f32", "t.bool")] == [int, float, bool]


def test_metadata_agrees_with_gguf_reader(tiny_model: Path) -> None:
    reference = gguf.GGUFReader(tiny_model)
    with GGUFFile(tiny_model) as f:
        for key, field in reference.fields.items():
            if key.startswith("GGUF.") or key == "t.nested":  # header pseudo-fields; nesting gguf can't decode
                continue
            assert f.metadata[key] == field.contents(), key


@pytest.mark.parametrize("alignment", [None, 64, 256])
def test_tensor_directory_agrees_with_gguf_reader(tmp_path: Path, alignment: int | None) -> None:
    path = write_tiny_model(tmp_path / "tiny.gguf", alignment=alignment)
    reference = gguf.GGUFReader(path)
    with GGUFFile(path) as f:
        assert f.alignment == (alignment or 32)
        assert list(f.tensors) == [t.name for t in reference.tensors]
        for ref in reference.tensors:
            info = f.tensors[ref.name]
            assert info == GGUFTensorInfo(
                ref.name,
                TENSOR_LAYOUT[ref.name][1],
                int(ref.tensor_type),
                ref.tensor_type.name,
                ref.data_offset,
                int(ref.n_bytes),
            )
            assert info.offset % f.alignment == 0


def test_raw_is_a_zero_copy_view_of_the_tensor_bytes(tiny_model: Path) -> None:
    reference = gguf.GGUFReader(tiny_model)
    with GGUFFile(tiny_model) as f:
        for ref in reference.tensors:
            raw = f.raw(ref.name)
            assert raw.dtype == np.uint8 and not raw.flags.owndata and not raw.flags.writeable
            np.testing.assert_array_equal(raw, ref.data.view(np.uint8).reshape(-1))


def test_load_dequantizes_like_gguf(tiny_model: Path) -> None:
    reference = gguf.GGUFReader(tiny_model)
    with GGUFFile(tiny_model) as f:
        for ref in reference.tensors:
            expected = gguf.quants.dequantize(ref.data, ref.tensor_type)
            loaded = f.load(ref.name)
            assert loaded.shape == TENSOR_LAYOUT[ref.name][1]
            assert_bitwise_equal(loaded, expected)


def test_version_2_files_are_read_the_same(tiny_model: Path) -> None:
    data = bytearray(tiny_model.read_bytes())
    data[4:8] = (2).to_bytes(4, "little")
    v2 = tiny_model.with_name("v2.gguf")
    v2.write_bytes(data)
    with GGUFFile(tiny_model) as v3_file, GGUFFile(v2) as v2_file:
        assert v2_file.version == 2
        assert v2_file.metadata == v3_file.metadata and v2_file.tensors == v3_file.tensors


def test_strings_that_are_not_utf8_round_trip(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "bytes.gguf", {}, {"t.raw": (b"\xff\xfeok", V.STRING)})
    with GGUFFile(path) as f:
        assert f.metadata["t.raw"].encode("utf-8", "surrogateescape") == b"\xff\xfeok"
        assert f.tensors == {}


@pytest.fixture
def model_with_iq2(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    tensors = {
        "ok.weight": (Q.Q8_0, random_tensor_bytes(rng, Q.Q8_0, 64), (2, 32)),
        "blk.0.attn_q.weight": (Q.IQ2_XXS, rng.integers(0, 256, 66, dtype=np.uint8), (256,)),
    }
    return write_gguf(tmp_path / "iq2.gguf", tensors)


def test_unsupported_quant_types_are_listed_at_open(model_with_iq2: Path) -> None:
    with pytest.raises(CheckpointError) as excinfo:
        GGUFFile(model_with_iq2)
    message = str(excinfo.value)
    assert message.startswith(f"{model_with_iq2}: ")
    assert "blk.0.attn_q.weight has unsupported type IQ2_XXS (16)" in message
    assert "supported: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K" in message


def test_unsupported_tensors_can_be_inspected_but_not_loaded(model_with_iq2: Path) -> None:
    with GGUFFile(model_with_iq2, require_supported=False) as f:
        assert f.unsupported_tensors == {"blk.0.attn_q.weight": "IQ2_XXS"}
        assert f.tensors["blk.0.attn_q.weight"].nbytes == 66
        assert f.load("ok.weight").shape == (2, 32)
        with pytest.raises(CheckpointError, match=r"blk\.0\.attn_q\.weight has unsupported type IQ2_XXS \(16\)"):
            f.load("blk.0.attn_q.weight")


def test_unknown_tensor_and_closed_file_raise_checkpoint_error(tiny_model: Path) -> None:
    f = GGUFFile(tiny_model)
    with pytest.raises(CheckpointError, match="no tensor named 'missing'"):
        f.load("missing")
    kept = f.raw("norm.weight")  # a live view must survive close()
    f.close()
    assert kept.size == 24 * 4
    with pytest.raises(CheckpointError, match="closed"):
        f.load("norm.weight")


# -- the two real checkpoints -------------------------------------------------------

MODEL_DIR = Path(os.environ.get("EMBER_MODEL_DIR", Path.home() / ".cache" / "ember" / "models"))
REAL_MODELS = [
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma-3-270m-q4_k_m.gguf",
]
SAMPLES_PER_TYPE = 2


@pytest.fixture(scope="module", params=REAL_MODELS)
def real_model(request: pytest.FixtureRequest) -> tuple[GGUFFile, gguf.GGUFReader]:
    path = MODEL_DIR / request.param
    if not path.is_file():
        pytest.skip(f"{path} is not assembled on this machine")
    ours = GGUFFile(path)
    yield ours, gguf.GGUFReader(path)  # gguf's reader is slow (~20 s): once per file
    ours.close()


@pytest.mark.real_model
def test_real_model_header_agrees_with_gguf_reader(real_model: tuple[GGUFFile, gguf.GGUFReader]) -> None:
    ours, reference = real_model
    assert [t.name for t in reference.tensors] == list(ours.tensors)
    for ref in reference.tensors:
        info = ours.tensors[ref.name]
        assert (info.shape, info.ggml_type, info.offset, info.nbytes) == (
            tuple(reversed(ref.shape.tolist())),
            int(ref.tensor_type),
            ref.data_offset,
            int(ref.n_bytes),
        )
    for key, field in reference.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == field.contents(), key


@pytest.mark.real_model
def test_real_model_load_matches_gguf_for_every_type(real_model: tuple[GGUFFile, gguf.GGUFReader]) -> None:
    ours, reference = real_model
    by_type: dict[int, list] = {}
    for ref in sorted(reference.tensors, key=lambda t: t.n_bytes):  # smallest first: fast
        by_type.setdefault(int(ref.tensor_type), []).append(ref)
    assert set(by_type) <= {Q.F32, Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K}
    for refs in by_type.values():
        for ref in refs[:SAMPLES_PER_TYPE] + refs[len(refs) // 2 : len(refs) // 2 + 1]:
            assert_bitwise_equal(ours.load(ref.name), gguf.quants.dequantize(ref.data, ref.tensor_type))
