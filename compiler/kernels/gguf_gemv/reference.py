"""Plain `jnp` references for the quantized layouts (layout.py): dequantization and x @ W.T.

Dequantization is bit for bit equal to `gguf.quants.dequantize` (and so to ggml): each scale product
(`d * sc`, `dmin * m`) is exact in float32 and each output is rounded once, so the result does not
depend on evaluation order or FMA contraction (see runtime/loader/dequant_kquants.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.gguf_gemv.layout import Q4_K, Q5_0, Q6_K, Q8_0, QuantizedWeight


def _fields(words: jax.Array, count: int, bits: int) -> jax.Array:
    """uint32 [..., w] -> uint32 [..., count, w]: field f is bits f*bits .. f*bits + bits - 1 of each word."""
    shifts = (jnp.arange(count, dtype=jnp.uint32) * bits)[:, None]
    return (words[..., None, :] >> shifts) & jnp.uint32((1 << bits) - 1)


def _rows_major(blocks: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """[blocks, out, elements per block] -> [out, in]."""
    return jnp.swapaxes(blocks, 0, 1).reshape(shape)


def q4_k_scales_and_mins(scales: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The 12 packed bytes as uint32 [..., 3] -> (scales, mins), each uint32 [..., 8] of 6-bit values.

    byte 0..3   scale j (j < 4) in bits 0..5; bits 6..7 are bits 4..5 of scale j + 4
    byte 4..7   min j in bits 0..5; bits 6..7 are bits 4..5 of min j + 4
    byte 8..11  low nibble: bits 0..3 of scale j + 4; high nibble: bits 0..3 of min j + 4
    """
    b = _fields(scales, 4, 8)  # [..., byte in word, word]
    first, second, third = b[..., 0], b[..., 1], b[..., 2]
    sc = jnp.concatenate([first & 63, (third & 15) | ((first >> 6) << 4)], axis=-1)
    mn = jnp.concatenate([second & 63, (third >> 4) | ((second >> 6) << 4)], axis=-1)
    return sc, mn


def q4_k_parts(w: QuantizedWeight) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(codes float32 [sb, out, 8, 32] in element order, d * sc and dmin * m float32 [sb, out, 8] (exact
    products)): sub-block n's weights are scale[n] * codes[n] - minimum[n]."""
    p = w.planes
    nsb, out = p["d"].shape
    codes = _fields(p["qs"].reshape(nsb, out, 8, 4), 8, 4)  # [sb, out, n, i, q]: element 32n + 4i + q
    codes = codes.reshape(nsb, out, 8, 32).astype(jnp.float32)
    sc, mn = q4_k_scales_and_mins(p["scales"])  # [sb, out, 8]
    scale = p["d"].astype(jnp.float32)[..., None] * sc.astype(jnp.float32)
    minimum = p["dmin"].astype(jnp.float32)[..., None] * mn.astype(jnp.float32)
    return codes, scale, minimum


def dequantize_q4_k(w: QuantizedWeight) -> jax.Array:
    codes, scale, minimum = q4_k_parts(w)
    values = scale[..., None] * codes - minimum[..., None]
    return _rows_major(values.reshape(*values.shape[:2], 256), w.shape)


def q6_k_parts(w: QuantizedWeight) -> tuple[jax.Array, jax.Array]:
    """(codes uint32 [sb, out, 16, 16] (0..63, element 16t + e of sub-block t), d * scale float32 [sb, out, 16]):
    sub-block t's weights are scale[t] * (codes[t] - 32)."""
    p = w.planes
    nsb, out = p["d"].shape
    low = _fields(p["ql"].reshape(nsb, out, 8, 4), 8, 4).reshape(nsb, out, 8, 4, 2, 4)  # [.., n, j, h, q]
    high = _fields(p["qh"], 16, 2).reshape(nsb, out, 4, 4, 8, 2)  # [.., j, q, n, h]
    low = jnp.transpose(low, (0, 1, 2, 4, 3, 5))  # [.., n, h, j, q]
    high = jnp.transpose(high, (0, 1, 4, 5, 2, 3))
    codes = (low | (high << 4)).reshape(nsb, out, 16, 16)
    scale = p["d"].astype(jnp.float32)[..., None] * p["scales"].astype(jnp.float32)
    return codes, scale


def dequantize_q6_k(w: QuantizedWeight) -> jax.Array:
    codes, scale = q6_k_parts(w)
    nsb, out = scale.shape[:2]
    values = scale[..., None] * (codes.astype(jnp.int32) - 32).astype(jnp.float32)
    return _rows_major(values.reshape(nsb, out, 256), w.shape)


def dequantize_q8_0(w: QuantizedWeight) -> jax.Array:
    p = w.planes
    values = p["d"].astype(jnp.float32)[..., None] * p["qs"].astype(jnp.float32)  # [blocks, out, 32]
    return _rows_major(values, w.shape)


def q5_0_codes(w: QuantizedWeight) -> jax.Array:
    """Signed codes int32 [blocks, out, 32] (-16..15, element order) of a Q5_0 weight."""
    p = w.planes
    qs = p["qs"].astype(jnp.int32)  # [blocks, out, 16]
    low = jnp.concatenate([qs & 15, qs >> 4], axis=-1)  # element j: byte j % 16
    high = (p["qh"].astype(jnp.uint32)[..., None] >> jnp.arange(32, dtype=jnp.uint32)) & 1
    return (low | (high.astype(jnp.int32) << 4)) - 16


def dequantize_q5_0(w: QuantizedWeight) -> jax.Array:
    values = w.planes["d"].astype(jnp.float32)[..., None] * q5_0_codes(w).astype(jnp.float32)
    return _rows_major(values, w.shape)


DEQUANTIZERS = {Q4_K: dequantize_q4_k, Q6_K: dequantize_q6_k, Q8_0: dequantize_q8_0, Q5_0: dequantize_q5_0}


def dequantize(w: QuantizedWeight) -> jax.Array:
    """Quantized [out, in] -> float32 [out, in]."""
    return DEQUANTIZERS[w.format](w)


def quant_matmul_ref(x: jax.Array, w: QuantizedWeight) -> jax.Array:
    """x [m, in] @ W.T -> [m, out] in x's dtype, accumulated in float32 (exact fp32 products, no TF32)."""
    y = jnp.einsum("mk,ok->mo", x.astype(jnp.float32), dequantize(w), precision=jax.lax.Precision.HIGHEST)
    return y.astype(x.dtype)
