"""A GGUF-quantized weight as the cpu target keeps it: int8 codes and block scales, exactly its values.

Every format the loader keeps is an affine code per block: Q4_K w = (d * sc) * code - dmin * m per 32
elements (code 0..15), Q6_K w = (d * scale) * (code - 32) per 16, Q8_0 w = d * code per 32, Q5_0
w = d * (code - 16) per 32. As BlockQ8Weight:

  codes  int8    [out, in]             the signed code of each element (row-major: a row is contiguous)
  scale  float32 [out, in / block]     the block's multiplier (an exact float32 product, as dequantize has it)
  offset float32 [out, in / block]     what the block subtracts (Q4_K's minimum), or [0] where nothing is

so `scale * code - offset` is bit for bit what gguf_gemv/reference.py's dequantize gives. The weight costs
1.25 (Q4_K), 1.25 (Q6_K), 1.125 (Q8_0, Q5_0) bytes per element where the exact path keeps 4. With nibbles
(WeightPolicy.kept_layout "nibble_blocks"), Q4_K's codes (0..15) come two per byte instead:

  codes  uint8   [out, in / 2]         per block of 32, byte j = code j | code (j + 16) << 4

0.75 bytes per element, the same values (block_q8.cc unpacks them to the same int16 codes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ember.compiler.kernels.gguf_gemv.layout import Q4_K, Q5_0, Q6_K, Q8_0, QuantizedWeight
from ember.compiler.kernels.gguf_gemv.reference import q4_k_parts, q5_0_codes, q6_k_parts


class BlockQ8Weight(NamedTuple):
    codes: jax.Array  # int8 [out, in]
    scale: jax.Array  # float32 [out, in / block]
    offset: jax.Array  # float32 [out, in / block], or [0]: no offsets
    dtype: str | None = None  # what a gather's dequantized rows come out as (the activation dtype); None: float32
    split: Any = None  # a kept_shards.WeightSplit where the weight is split over a device mesh, else None

    @property
    def nibbles(self) -> bool:
        return self.codes.dtype == jnp.uint8

    @property
    def shape(self) -> tuple[int, int]:
        out, columns = (int(n) for n in self.codes.shape)
        return out, columns * (2 if self.nibbles else 1)

    @property
    def block(self) -> int:
        return self.shape[1] // int(self.scale.shape[1])

    @property
    def nbytes(self) -> int:
        return sum(int(a.size) * a.dtype.itemsize for a in (self.codes, self.scale, self.offset))


jax.tree_util.register_pytree_node(
    BlockQ8Weight,
    lambda w: ((w.codes, w.scale, w.offset), (w.dtype, w.split)),
    lambda aux, children: BlockQ8Weight(*children, *aux),
)

NO_OFFSET = (0,)


def _rows_major(blocks: jax.Array) -> jax.Array:
    """[blocks, out, elements per block] -> [out, in]."""
    return jnp.swapaxes(blocks, 0, 1).reshape(blocks.shape[1], -1)


@jax.jit
def _q4_k(w: QuantizedWeight):
    codes, scale, minimum = q4_k_parts(w)  # [sb, out, 8, 32], [sb, out, 8] x 2
    nsb, out = scale.shape[:2]
    flat = lambda a: _rows_major(a.reshape(nsb, out, -1))  # noqa: E731
    return flat(codes).astype(jnp.int8), flat(scale), flat(minimum)


@jax.jit
def _q6_k(w: QuantizedWeight):
    codes, scale = q6_k_parts(w)  # [sb, out, 16, 16], [sb, out, 16]
    nsb, out = scale.shape[:2]
    signed = codes.astype(jnp.int32) - 32
    return _rows_major(signed.reshape(nsb, out, 256)).astype(jnp.int8), _rows_major(scale)


@jax.jit
def _q8_0(w: QuantizedWeight):
    return _rows_major(w.planes["qs"]).astype(jnp.int8), _rows_major(w.planes["d"].astype(jnp.float32)[..., None])


@jax.jit
def _q5_0(w: QuantizedWeight):
    codes = _rows_major(q5_0_codes(w)).astype(jnp.int8)
    return codes, _rows_major(w.planes["d"].astype(jnp.float32)[..., None])


@jax.jit
def _pack_nibbles(codes: jax.Array) -> jax.Array:
    """int8 codes 0..15 [out, in] -> uint8 [out, in / 2]: per block of 32, byte j = code j | code (j + 16) << 4."""
    out, inner = codes.shape
    blocks = codes.reshape(out, inner // 32, 2, 16).astype(jnp.uint8)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(out, inner // 2)


def unpacked_codes(w: BlockQ8Weight) -> jax.Array:
    """int8 [out, in]: the codes one per element (nibble pairs unpacked)."""
    if not w.nibbles:
        return w.codes
    out, columns = w.codes.shape
    pairs = w.codes.reshape(out, columns // 16, 1, 16)
    return jnp.concatenate([pairs & 0x0F, pairs >> 4], axis=2).reshape(out, columns * 2).astype(jnp.int8)


def from_quantized(w: QuantizedWeight, nibbles: bool = False) -> BlockQ8Weight:
    """The GGUF weight (gguf_gemv/layout.py's planes, on the device) as codes and block scales, losslessly;
    nibbles: Q4_K's codes two per byte (other formats' codes do not fit 4 bits and stay int8)."""
    if w.format == Q4_K:
        codes, scale, offset = _q4_k(w)
        if nibbles:
            codes = _pack_nibbles(codes)
    elif w.format in (Q6_K, Q8_0, Q5_0):
        codes, scale = {Q6_K: _q6_k, Q8_0: _q8_0, Q5_0: _q5_0}[w.format](w)
        offset = jnp.zeros(NO_OFFSET, jnp.float32)
    else:
        raise ValueError(f"no int8 block form for {w.format!r}")
    return BlockQ8Weight(codes, scale, offset, w.dtype)


def dequantize(w: BlockQ8Weight) -> jax.Array:
    """float32 [out, in]: scale * code - offset per block (equal to the GGUF weight's values)."""
    out, inner = w.shape
    values = unpacked_codes(w).reshape(out, -1, w.block).astype(jnp.float32) * w.scale[..., None]
    if w.offset.size:
        values = values - w.offset[..., None]
    return values.reshape(out, inner)


def take_rows(w: BlockQ8Weight, ids: jax.Array) -> BlockQ8Weight:
    """The rows `ids` of w (an embedding gather reads only its tokens' rows)."""
    offset = jnp.take(w.offset, ids, axis=0) if w.offset.size else w.offset
    return BlockQ8Weight(jnp.take(w.codes, ids, axis=0), jnp.take(w.scale, ids, axis=0), offset, w.dtype)
