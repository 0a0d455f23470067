"""Dequantization of GGUF tensor data to float32: the public entry point.

These functions are the numerical references that Ember's GPU dequant kernels
are tested against, so they must be exact: each one matches
`gguf.quants.dequantize` bit for bit (tests/kernels/gguf_gemv/test_dequant.py). The per-format
block decoders live in `dequant_legacy.py` (32-element blocks: Q8_0, Q4_0,
Q5_0) and `dequant_kquants.py` (256-element super-blocks: Q4_K, Q5_K, Q6_K);
this module adds the plain float formats, the size table and the chunking that
keeps peak memory close to the size of the output.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ember.runtime.loading.formats.dequant_kquants import dequantize_q4_k, dequantize_q5_k, dequantize_q6_k
from ember.runtime.loading.formats.dequant_legacy import dequantize_q4_0, dequantize_q5_0, dequantize_q8_0

# ggml type ids (ggml.h `enum ggml_type`); only the ones Ember can dequantize.
F32, F16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 6, 8, 12, 13, 14, 30

TYPE_NAMES: dict[int, str] = {
    F32: "F32",
    F16: "F16",
    BF16: "BF16",
    Q8_0: "Q8_0",
    Q4_0: "Q4_0",
    Q5_0: "Q5_0",
    Q4_K: "Q4_K",
    Q5_K: "Q5_K",
    Q6_K: "Q6_K",
}

# ggml type id -> (elements per block, bytes per block).
BLOCK_SIZES: dict[int, tuple[int, int]] = {
    F32: (1, 4),
    F16: (1, 2),
    BF16: (1, 2),
    Q8_0: (32, 34),
    Q4_0: (32, 18),
    Q5_0: (32, 22),
    Q4_K: (256, 144),
    Q5_K: (256, 176),
    Q6_K: (256, 210),
}

SUPPORTED_TYPES: frozenset[int] = frozenset(BLOCK_SIZES)

# Block decoders: uint8 [n_blocks, bytes_per_block] -> float32 [n_blocks, elements_per_block].
_BLOCK_DECODERS: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    Q8_0: dequantize_q8_0,
    Q4_0: dequantize_q4_0,
    Q5_0: dequantize_q5_0,
    Q4_K: dequantize_q4_k,
    Q5_K: dequantize_q5_k,
    Q6_K: dequantize_q6_k,
}

# Output elements decoded per step. The decoders make a handful of temporaries
# the size of their output; 256K elements keeps them cache-sized (measured
# fastest) and the overhead a few MB however large the tensor, so peak memory
# is the output itself (a 151936 x 1536 embedding is 890 MB of float32).
_CHUNK_ELEMENTS = 1 << 18


def supported_type_names() -> str:
    """'F32, F16, BF16, Q8_0, ...' for error messages."""
    return ", ".join(TYPE_NAMES[t] for t in BLOCK_SIZES)


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes that a tensor of `shape` (numpy order) occupies in `ggml_type`."""
    block_elems, block_bytes = BLOCK_SIZES[ggml_type]
    n_elements = int(np.prod(shape, dtype=object)) if shape else 1
    if shape and shape[-1] % block_elems:
        raise ValueError(
            f"row length {shape[-1]} is not a multiple of the {TYPE_NAMES[ggml_type]} block size {block_elems}"
        )
    return n_elements // block_elems * block_bytes


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Decode `raw` (the tensor's bytes, uint8) of type `ggml_type` into float32 of `shape`.

    The result never aliases `raw` (so a memory map under it may be closed).
    Raises ValueError for an unsupported type or a byte count that does not
    match the shape.
    """
    if ggml_type not in SUPPORTED_TYPES:
        raise ValueError(f"unsupported ggml type {ggml_type}; supported: {supported_type_names()}")
    shape = tuple(int(d) for d in shape)
    expected = tensor_nbytes(ggml_type, shape)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise ValueError(f"raw data must be uint8, got {raw.dtype}")
    raw = raw.reshape(-1)
    if raw.size != expected:
        raise ValueError(f"{TYPE_NAMES[ggml_type]} tensor of shape {shape} needs {expected} bytes, got {raw.size}")

    if ggml_type == F32:
        return raw.view("<f4").astype(np.float32).reshape(shape)
    if ggml_type == F16:
        return raw.view("<f2").astype(np.float32).reshape(shape)
    if ggml_type == BF16:
        return _bf16_to_f32(raw).reshape(shape)
    return _dequantize_blocks_chunked(raw, ggml_type).reshape(shape)


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    # bf16 is the top half of an f32: widen the 16 bits and shift them up.
    return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)


def _dequantize_blocks_chunked(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    block_elems, block_bytes = BLOCK_SIZES[ggml_type]
    decode = _BLOCK_DECODERS[ggml_type]
    blocks = raw.reshape(-1, block_bytes)  # [n_blocks, block_bytes]
    n_blocks = blocks.shape[0]
    out = np.empty((n_blocks, block_elems), dtype=np.float32)
    step = max(1, _CHUNK_ELEMENTS // block_elems)
    # A corrupt or deliberately odd checkpoint may hold inf/NaN scales; inf * 0
    # is NaN as in ggml, which is the answer, not something to warn about.
    with np.errstate(invalid="ignore"):
        for start in range(0, n_blocks, step):
            stop = min(start + step, n_blocks)
            out[start:stop] = decode(blocks[start:stop])
    return out
