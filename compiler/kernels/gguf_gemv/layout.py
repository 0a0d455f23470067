"""Device layouts for GGUF-quantized weight matrices, and the host functions that repack GGUF bytes into them.

A weight matrix is [out, in] (rows are outputs, as GGUF and HF store them); GGUF stores each row as
consecutive blocks along `in`. On the device the blocks are split into planes, one array per field,
each laid out **block-major**: [in / block, out, ...]. A decode kernel owns a tile of output rows and
walks `in` block by block, so at every step the tile's rows of one plane are one contiguous run of
memory (BLOCK_N rows x 128 bytes of Q4_K nibbles, BLOCK_N x 2 bytes of fp16 scales, ...): every load is
wide and coalesced, the small planes (scales) included. Column-parallel sharding splits axis 1,
row-parallel sharding axis 0. Stacking matrices along `out` (packed q/k/v, gate/up) is concatenating
every plane along axis 1, the same as packing their concatenated GGUF rows (whole blocks each).

The codes are re-ordered inside each block so that a kernel extracts codes with a single shift and mask
over a vector of words (no gathers), and the bytes per block stay exactly GGUF's:

Q4_K (144 B per 256 elements, 8 sub-blocks of 32)
  qs     uint32  [in/256, out, 32]  word 4n + q holds sub-block n only: bits 4i..4i+3 = code of element
                                    32n + 4i + q. A thread that loads 4 consecutive words (16 bytes) holds
                                    one whole sub-block, so it decodes that sub-block's scale once for its
                                    32 weights, and nibble i of the 4 words is 4 consecutive elements.
  scales uint32  [in/256, out, 3]   GGUF's 12 packed 6-bit scale/min bytes, little-endian words
  d      float16 [in/256, out]      super-block scale
  dmin   float16 [in/256, out]      super-block scale of the minimums
  w[32n + j] = (d * sc[n]) * code - (dmin * m[n])
Q6_K (210 B per 256 elements, 16 sub-blocks of 16)
  ql     uint32  [in/256, out, 32]  word 4n + q holds elements 32n + 16h + 4j + q (sub-block t = 2n + h):
                                    bits 4(2j + h)..+3 = the element's low 4 bits. So `word & 0x0F0F0F0F`
                                    is 4 elements of sub-block 2n and `(word >> 4) & 0x0F0F0F0F` 4 of
                                    2n + 1, one byte each, as the integer-dot kernel needs (dp4a).
  qh     uint32  [in/256, out, 16]  word 2n + h: bits 8j + 2q..+1 = high 2 bits of element 32n + 16h + 4j + q
                                    (`(word >> 2q) & 0x03030303` lines up with ql word q's bytes of half h)
  scales int8    [in/256, out, 16]  per sub-block scale
  d      float16 [in/256, out]
  w[16t + e] = (d * scales[t]) * ((low | high << 4) - 32)
Q8_0 (34 B per 32 elements)
  qs     int8    [in/32, out, 32]   element j of the block
  d      float16 [in/32, out]
  w[j] = d * qs[j]
Q5_0 (22 B per 32 elements; GGUF's fallback for rows that are not whole 256-element super-blocks)
  qs     uint8   [in/32, out, 16]   GGUF's bytes: byte l holds the low 4 bits of element l (low nibble) and
                                    of element l + 16 (high nibble)
  qh     uint32  [in/32, out]       bit j = the 5th bit of element j
  d      float16 [in/32, out]
  w[j] = d * ((low | high << 4) - 16)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

Q4_K, Q6_K, Q8_0, Q5_0 = "q4_k", "q6_k", "q8_0", "q5_0"

# format -> (elements per block, GGUF bytes per block, ggml type id)
FORMATS: dict[str, tuple[int, int, int]] = {
    Q4_K: (256, 144, 12),
    Q6_K: (256, 210, 14),
    Q8_0: (32, 34, 8),
    Q5_0: (32, 22, 6),
}
GGML_TYPE_FORMATS: dict[int, str] = {ggml_type: fmt for fmt, (_, _, ggml_type) in FORMATS.items()}


class QuantizedWeight(NamedTuple):
    """One quantized [out, in] matrix: `planes` (arrays, the pytree leaves) + static `format` and `shape`.

    `dtype` (static) is the dtype that ops materialising values produce (an embedding gather's rows):
    the model's activation dtype, set by the loader; None means float32.
    """

    planes: dict[str, np.ndarray | jax.Array]
    format: str
    shape: tuple[int, int]  # (out, in)
    dtype: str | None = None
    split: Any = None  # a kernels/kept_shards.py WeightSplit where the planes are split over a device mesh

    @property
    def nbytes(self) -> int:
        """Bytes a kernel reads for the whole matrix (equal to the GGUF tensor's size)."""
        return sum(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize for p in self.planes.values())


# A pytree whose only leaves are the planes, so `jax.jit`, `device_put` and sharding see arrays only.
jax.tree_util.register_pytree_node(
    QuantizedWeight,
    lambda w: ((w.planes,), (w.format, w.shape, w.dtype, w.split)),
    lambda aux, children: QuantizedWeight(children[0], *aux),
)


class WeightGroup(NamedTuple):
    """Projections of one input packed side by side ([sum out_i, in]) but stored apart, because their
    formats differ (e.g. a Q4_K attn_q / attn_k beside a Q6_K attn_v): one matmul per part.

    Each part is a QuantizedWeight or a float [out_i, in] array (a format the target does not keep).
    A NamedTuple, so a pytree whose leaves are the parts' arrays.
    """

    parts: tuple

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(int(p.shape[0]) for p in self.parts), int(self.parts[0].shape[1]))

    @property
    def nbytes(self) -> int:
        return sum(int(p.nbytes) for p in self.parts)


class DenseBacked(NamedTuple):
    """A weight kept quantized (`kept`: a QuantizedWeight or a WeightGroup) together with its dense copy
    (`dense`: [out, in] in the activation dtype, the kept weight dequantized once at load).

    Why both: the quantized GEMV wins where a step has few rows (it reads ~4.5 bits per weight instead of 16),
    but a step with more rows is compute-bound, and without the copy it would dequantize the whole weight on
    every call (measured on the H200, 1.5B Q4_K_M: 8,173 tok/s at 32 streams quantized vs 17,147 on bf16
    weights). linear_quant picks the form by the step's row count. A pytree: leaves are both forms' arrays.
    """

    kept: Any
    dense: Any

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(int(n) for n in self.kept.shape)

    @property
    def nbytes(self) -> int:
        """Bytes a decode-sized step reads (the kept form); the copy is read only by steps with many rows."""
        return int(self.kept.nbytes)


def _blocks(raw: np.ndarray, fmt: str, shape: tuple[int, int]) -> np.ndarray:
    """GGUF bytes of an [out, in] matrix -> uint8 [out, in / block, bytes per block]."""
    out, inner = shape
    block, block_bytes, _ = FORMATS[fmt]
    if inner % block:
        raise ValueError(f"{fmt}: row length {inner} is not a multiple of the block size {block}")
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    expected = out * inner // block * block_bytes
    if raw.size != expected:
        raise ValueError(f"{fmt} {shape}: expected {expected} bytes, got {raw.size}")
    return raw.reshape(out, inner // block, block_bytes)


def _fp16_plane(blocks: np.ndarray, start: int) -> np.ndarray:
    """Little-endian fp16 at bytes [start, start + 2) of each block -> float16 [blocks, out]."""
    return np.ascontiguousarray(blocks[:, :, start : start + 2]).view("<f2")[..., 0].T.astype(np.float16).copy()


def _words(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., fields, words] -> uint32 [..., words]: field f goes to bits f*bits.. of each word.

    Built a byte at a time in uint8 (8 / bits fields per byte), then the 4 bytes viewed as one little-endian
    word: ~10x faster at load than shifting uint32 copies (an 8B model's weights repack in seconds)."""
    per_byte = 8 // bits
    fields = codes.shape[-2]
    if fields * bits != 32:
        raise ValueError(f"{fields} fields of {bits} bits do not fill a 32-bit word")
    grouped = codes.reshape(*codes.shape[:-2], 4, per_byte, codes.shape[-1])  # [..., byte, field, word]
    packed = grouped[..., 0, :].copy()
    for k in range(1, per_byte):
        packed |= grouped[..., k, :] << np.uint8(k * bits)
    as_bytes = np.ascontiguousarray(np.swapaxes(packed, -1, -2))  # [..., word, byte]
    return as_bytes.view("<u4")[..., 0].astype(np.uint32, copy=False)


def _block_major(plane: np.ndarray) -> np.ndarray:
    """[out, blocks, ...] -> contiguous [blocks, out, ...]."""
    return np.ascontiguousarray(np.swapaxes(plane, 0, 1))


def q4_k_codes(blocks: np.ndarray) -> np.ndarray:
    """Q4_K's 128 code bytes (GGUF order) -> uint8 [..., 256] codes in element order.

    GGUF keeps 4 runs of 32 bytes; run r holds element 64r + l in the low nibble of byte l and
    element 64r + 32 + l in the high nibble.
    """
    runs = blocks[..., 16:144].reshape(*blocks.shape[:-1], 4, 1, 32)
    return np.concatenate([runs & 0x0F, runs >> 4], axis=-2).reshape(*blocks.shape[:-1], 256)


def q6_k_codes(blocks: np.ndarray) -> np.ndarray:
    """Q6_K's ql/qh bytes (GGUF order) -> uint8 [..., 256] unsigned 6-bit codes (q + 32) in element order.

    Two halves of 128 elements; element 32k + l of half h takes its low 4 bits from ql[64h + l] (k = 0),
    ql[64h + 32 + l] (k = 1), their high nibbles (k = 2, 3), and its high 2 bits from bits 2k of
    qh[32h + l].
    """
    lead = blocks.shape[:-1]
    ql = blocks[..., 0:128].reshape(*lead, 2, 2, 32)  # [.., half, run, l]
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=-2)  # [.., half, k, l]
    qh = blocks[..., 128:192].reshape(*lead, 2, 1, 32)
    high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 0x03  # [.., half, k, l]
    return (low | (high << 4)).reshape(*lead, 256)


def pack_q4_k(raw: np.ndarray, shape: tuple[int, int]) -> QuantizedWeight:
    """GGUF Q4_K bytes of an [out, in] matrix -> the device layout (module docstring)."""
    blocks = _blocks(raw, Q4_K, shape)
    lead = blocks.shape[:2]
    # GGUF run r, byte l = 4i + q: its low nibble is element 64r + l (sub-block 2r), its high nibble element
    # 64r + 32 + l (sub-block 2r + 1); both are nibble i of word q of their sub-block.
    runs = blocks[..., 16:144].reshape(*lead, 4, 8, 4)  # [.., r, i, q]
    halves = np.stack([_words(runs & 0x0F, 4), _words(runs >> 4, 4)], axis=-2)  # [.., r, h, q]
    planes = {
        "qs": _block_major(halves.reshape(*lead, 32)),  # [sb, out, 32]: word 4(2r + h) + q
        "scales": _block_major(np.ascontiguousarray(blocks[..., 4:16]).view("<u4").astype(np.uint32)),
        "d": _fp16_plane(blocks, 0),
        "dmin": _fp16_plane(blocks, 2),
    }
    return QuantizedWeight(planes, Q4_K, tuple(shape))


def pack_q6_k(raw: np.ndarray, shape: tuple[int, int]) -> QuantizedWeight:
    """GGUF Q6_K bytes of an [out, in] matrix -> the device layout (module docstring)."""
    blocks = _blocks(raw, Q6_K, shape)
    lead = blocks.shape[:2]
    codes = q6_k_codes(blocks).reshape(*lead, 8, 2, 4, 4)  # [.., n, h, j, q]: 32n + 16h + 4j + q
    low, high = codes & 0x0F, codes >> 4
    ql = _words(np.swapaxes(low, -3, -2).reshape(*lead, 8, 8, 4), 4)  # [.., n, field 2j + h, q] -> [.., n, q]
    qh = _words(np.moveaxis(high.reshape(*lead, 16, 16), -1, -2), 2)  # [.., field 4j + q, word 2n + h]
    planes = {
        "ql": _block_major(ql.reshape(*lead, 32)),
        "qh": _block_major(qh),
        "scales": _block_major(blocks[..., 192:208].view(np.int8)),
        "d": _fp16_plane(blocks, 208),
    }
    return QuantizedWeight(planes, Q6_K, tuple(shape))


def pack_q8_0(raw: np.ndarray, shape: tuple[int, int]) -> QuantizedWeight:
    """GGUF Q8_0 bytes of an [out, in] matrix -> the device layout (module docstring)."""
    blocks = _blocks(raw, Q8_0, shape)
    planes = {"qs": _block_major(blocks[..., 2:34].view(np.int8)), "d": _fp16_plane(blocks, 0)}
    return QuantizedWeight(planes, Q8_0, tuple(shape))


def pack_q5_0(raw: np.ndarray, shape: tuple[int, int]) -> QuantizedWeight:
    """GGUF Q5_0 bytes of an [out, in] matrix -> the device layout (module docstring)."""
    blocks = _blocks(raw, Q5_0, shape)
    qh = np.ascontiguousarray(blocks[..., 2:6]).view("<u4")[..., 0].astype(np.uint32)
    planes = {"qs": _block_major(blocks[..., 6:22]), "qh": _block_major(qh), "d": _fp16_plane(blocks, 0)}
    return QuantizedWeight(planes, Q5_0, tuple(shape))


PACKERS = {Q4_K: pack_q4_k, Q6_K: pack_q6_k, Q8_0: pack_q8_0, Q5_0: pack_q5_0}


def pack(raw: np.ndarray, fmt: str | int, shape: tuple[int, int]) -> QuantizedWeight:
    """Repack by format name ("q4_k", "q6_k", "q8_0", "q5_0") or ggml type id (12, 14, 8, 6)."""
    if not isinstance(fmt, str):
        if fmt not in GGML_TYPE_FORMATS:
            raise ValueError(f"no device layout for ggml type {fmt}")
        fmt = GGML_TYPE_FORMATS[fmt]
    return PACKERS[fmt](raw, shape)


# format -> byte offsets of the fp16 scales inside one GGUF block
SCALE_OFFSETS: dict[str, tuple[int, ...]] = {Q4_K: (0, 2), Q6_K: (208,), Q8_0: (0,), Q5_0: (0,)}


def random_gguf_bytes(
    rng: np.random.Generator, fmt: str, shape: tuple[int, int], *, realistic: bool = False
) -> np.ndarray:
    """Random valid GGUF bytes (uint8, 1-D) for an [out, in] matrix of `fmt`.

    Codes are uniform random bytes. fp16 scales are random finite bit patterns (zeros and subnormals
    included), or with realistic=True small positive values like a trained model's (|N(0, 0.01)|;
    Q6_K's int8 scales stay random), so that products stay in bf16's comfortable range.
    """
    out, inner = shape
    block, block_bytes, _ = FORMATS[fmt]
    n_blocks = out * inner // block
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for start in SCALE_OFFSETS[fmt]:
        if realistic:
            scale = np.abs(rng.normal(0.0, 0.01, n_blocks)).astype("<f2").view("<u2")
        else:
            scale = np.ascontiguousarray(raw[:, start : start + 2]).view("<u2")[:, 0]
            scale = np.where((scale & 0x7C00) == 0x7C00, scale & ~np.uint16(0x4000), scale).astype("<u2")
        raw[:, start : start + 2] = scale.reshape(-1, 1).view(np.uint8)
    return raw.reshape(-1)
