"""Shared builders for the GGUF tests: random quant blocks and tiny GGUF files.

Files are written with the `gguf` package's own GGUFWriter, so the reader is
tested against an independent producer of the format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from ember.runtime.loading.formats.dequant import BLOCK_SIZES

Q = gguf.GGMLQuantizationType

# Where each block keeps its fp16 scales (byte offsets inside the block).
FP16_SCALE_OFFSETS: dict[int, tuple[int, ...]] = {
    Q.Q8_0: (0,),
    Q.Q4_0: (0,),
    Q.Q5_0: (0,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}


def _make_finite(bits: np.ndarray, exponent_mask: int) -> np.ndarray:
    """Clear one exponent bit wherever the exponent is all ones (inf/NaN)."""
    top_exponent_bit = 1 << (exponent_mask.bit_length() - 1)
    special = (bits & exponent_mask) == exponent_mask
    return np.where(special, bits & ~np.uint16(top_exponent_bit), bits).astype(np.uint16)


def random_tensor_bytes(
    rng: np.random.Generator, ggml_type: int, n_elements: int, *, finite: bool = True
) -> np.ndarray:
    """Random raw bytes for `n_elements` of `ggml_type` (uint8, 1-D).

    With finite=True every fp16/bf16 scale or value is a finite number (zeros
    and subnormals included), so results can be compared without NaN rules.
    """
    block_elems, block_bytes = BLOCK_SIZES[ggml_type]
    n_blocks = n_elements // block_elems
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if finite:
        if ggml_type == Q.F16:
            raw = _make_finite(raw.view("<u2"), 0x7C00).view(np.uint8)
        elif ggml_type == Q.BF16:
            raw = _make_finite(raw.view("<u2"), 0x7F80).view(np.uint8)
        elif ggml_type == Q.F32:
            raw = rng.standard_normal(n_elements).astype("<f4").view(np.uint8).reshape(n_blocks, block_bytes)
        for offset in FP16_SCALE_OFFSETS.get(ggml_type, ()):
            scale = np.ascontiguousarray(raw[:, offset : offset + 2]).view("<u2")
            raw[:, offset : offset + 2] = _make_finite(scale, 0x7C00).view(np.uint8)
    return raw.reshape(-1)


def assert_bitwise_equal(ours: np.ndarray, ref: np.ndarray) -> None:
    """Same shape, float32, same NaN positions, identical bits everywhere else (so -0.0 != 0.0)."""
    assert ours.dtype == np.float32
    assert ours.shape == ref.shape
    ours_nan, ref_nan = np.isnan(ours), np.isnan(ref)
    np.testing.assert_array_equal(ours_nan, ref_nan)
    ours_bits = ours.view(np.uint32)[~ours_nan]
    ref_bits = np.asarray(ref, dtype=np.float32).view(np.uint32)[~ref_nan]
    mismatches = np.flatnonzero(ours_bits != ref_bits)
    assert mismatches.size == 0, f"{mismatches.size} elements differ, first at flat index {mismatches[0]}"


def byte_shape(shape: tuple[int, ...], ggml_type: int) -> tuple[int, ...]:
    """Numpy shape of a tensor's raw bytes: the last dim counted in bytes."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[Q(ggml_type)]
    return (*shape[:-1], shape[-1] // block_elems * block_bytes)


def write_gguf(
    path: Path,
    tensors: dict[str, tuple[int, np.ndarray, tuple[int, ...]]],
    metadata: dict[str, tuple[Any, ...]] | None = None,
    *,
    arch: str = "tiny",
    alignment: int | None = None,
) -> Path:
    """Write a GGUF file.

    tensors: name -> (ggml_type, raw uint8 bytes, numpy shape);
    metadata: key -> (value, GGUFValueType) or, for arrays, (list, ARRAY, element GGUFValueType).
    """
    writer = gguf.GGUFWriter(path, arch)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, (value, vtype, *sub_type) in (metadata or {}).items():
        writer.add_key_value(key, value, vtype, *sub_type)
    for name, (ggml_type, raw, shape) in tensors.items():
        writer.add_tensor(name, raw.reshape(byte_shape(shape, ggml_type)), raw_dtype=Q(ggml_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
