"""x [N, in] @ W.T for a BlockQ8Weight (layout.py): the native kernel (block_q8.cc) where it is built, else its
jnp form. Both quantize x to int16 per 32 elements (scale max|x| / 32767) and sum each block's integer dot times
its two scales; the offsets multiply each block's float sum of x. A row's result does not depend on the
other rows of the call (batch invariance: deterministic mode relies on it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.cpu_gemv import native
from ember.compiler.kernels.cpu_gemv.layout import BlockQ8Weight, unpacked_codes

CHUNK = 32  # activation elements per int8 scale


def block_q8_matmul(x: jax.Array, w: BlockQ8Weight) -> jax.Array:
    """x [N, in] (any float dtype) -> [N, out] in x's dtype."""
    x32 = x.astype(jnp.float32)
    if native.available():
        out = jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32)
        target = native.NIBBLE_TARGET if w.nibbles else native.TARGET
        y = jax.ffi.ffi_call(target, out)(x32, w.codes, w.scale, w.offset)
    else:
        y = block_q8_matmul_ref(x32, w)
    return y.astype(x.dtype)


LEVELS = 32767.0  # int16 activations: int8 ones moved the 1.5B's top-1 at 2.3% of the fixture's positions


def quantize_activations(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x float32 [N, in] -> (int16 codes [N, in / 32, 32], scales float32 [N, in / 32]), as the kernel makes them."""
    n, inner = x.shape
    chunks = x.reshape(n, inner // CHUNK, CHUNK)
    amax = jnp.max(jnp.abs(chunks), axis=-1)
    inv = jnp.where(amax > 0, LEVELS / jnp.where(amax > 0, amax, 1.0), 0.0)
    return jnp.round(chunks * inv[..., None]).astype(jnp.int16), amax / LEVELS


def block_q8_matmul_ref(x: jax.Array, w: BlockQ8Weight) -> jax.Array:
    """The kernel's arithmetic in jnp (float32 [N, in] -> float32 [N, out]); its sums in another order."""
    n, inner = x.shape
    out, block = w.shape[0], w.block
    xq, xs = quantize_activations(x)  # [N, c, 32], [N, c]
    codes = unpacked_codes(w).reshape(out, inner // block, block).astype(jnp.int32)
    xq = xq.reshape(n, inner // block, block).astype(jnp.int32)
    dots = jnp.einsum("nbk,obk->nob", xq, codes, preferred_element_type=jnp.int32)  # exact integer dots
    x_scale = jnp.repeat(xs, CHUNK // block, axis=1)  # [N, blocks]: each weight block's activation scale
    y = jnp.sum(dots.astype(jnp.float32) * w.scale[None] * x_scale[:, None, :], axis=-1)
    if w.offset.size:
        sums = x.reshape(n, inner // block, block).sum(-1)  # [N, blocks]
        y = y - sums @ w.offset.T
    return y
