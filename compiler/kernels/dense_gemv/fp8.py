"""FP8 (e4m3) weights: values in float8_e4m3fn, one float32 scale per output channel or per 128 x 128 block.

  per-channel  scale [out]            w[o, k] = values[o, k] * scale[o]
  block        scale [⌈out/128⌉, ⌈in/128⌉]   w[o, k] = values[o, k] * scale[o // 128, k // 128]
(the layouts of FP8 checkpoints: per-channel as in compressed-tensors / fbgemm "FP8-dynamic" files, 128 x 128
blocks as in the "fp8" quantization method with weight_block_size [128, 128], whose `weight_scale_inv` is this
scale; runtime/fp8_checkpoint.py reads both.)

A decode step reads each weight once, so a byte per weight halves the bf16 step's traffic. `fp8_linear`:
  one row (m <= the policy's fp8_gemv.max_rows; the kernel takes up to GEMV_MAX_ROWS = 16) traced for an NVIDIA GPU with
      Triton: the Triton GEMV (dense_gemv/kernel.py; its word loop 1.17-1.34x XLA's fusion alone at one row on the
      H200, slower at 8 rows); the policy's fp8_gemv.enabled off turns it off (read at trace time); fp8_linear_parts and
      fp8_linear_gate_up_silu are its fused forms (q/k/v outputs apart; silu(gate) * up in the epilogue);
  otherwise (prefill, mixed steps, any other backend: the CPU tests): `fp8_linear_xla`, written for XLA to
      fuse: per-channel, the scale leaves the dot (y[:, o] = scale[o] * Σ_k x[k] values[o, k]) and the
      fp8 -> activation-dtype convert sits on the dot's operand, which XLA's GEMM fusion reads from HBM as
      fp8; block scales multiply the converted operand before the dot.
fp32 accumulation throughout; the XLA path is the reference the kernel is checked against.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels import activation
from ember.compiler.kernels.gguf_gemv.matmul import split_columns
from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy

FP8 = jnp.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
BLOCK = 128  # the block size of block-scaled checkpoints
FP8_FORMATS = ("fp8", "fp8_block")  # per-channel, 128 x 128 blocks


class Fp8Weight(NamedTuple):
    """An [out, in] matrix in FP8 with its scales (both pytree leaves); `dtype` (static): what a gather of
    its rows produces (the model's activation dtype; None = float32)."""

    values: jax.Array  # float8_e4m3fn [out, in]
    scale: jax.Array  # float32 [out] (per channel) or [ceil(out / 128), ceil(in / 128)] (blocks)
    dtype: str | None = None
    split: object = None  # a kernels/kept_shards.py WeightSplit where the weight is split over a device mesh

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(int(n) for n in self.values.shape)

    @property
    def blocked(self) -> bool:
        return self.scale.ndim == 2

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes) + int(self.scale.nbytes)


jax.tree_util.register_pytree_node(
    Fp8Weight, lambda w: ((w.values, w.scale), (w.dtype, w.split)), lambda aux, children: Fp8Weight(*children, *aux)
)


def quantize_fp8(w, *, blocked: bool = False, dtype: str | None = None) -> Fp8Weight:
    """[out, in] float weights -> Fp8Weight, each row (or 128 x 128 block) scaled so its largest |w| is 448."""
    w = jnp.asarray(w, jnp.float32)
    out, inner = w.shape
    if not blocked:
        amax = jnp.max(jnp.abs(w), axis=1)
        scale = jnp.where(amax > 0, amax / FP8_MAX, 1.0)
        return Fp8Weight((w / scale[:, None]).astype(FP8), scale, dtype)
    rows, cols = -(-out // BLOCK), -(-inner // BLOCK)
    padded = jnp.pad(jnp.abs(w), ((0, rows * BLOCK - out), (0, cols * BLOCK - inner)))
    amax = padded.reshape(rows, BLOCK, cols, BLOCK).max(axis=(1, 3))
    scale = jnp.where(amax > 0, amax / FP8_MAX, 1.0)
    return Fp8Weight((w / _expand(scale, out, inner)).astype(FP8), scale, dtype)


def _expand(scale, out: int, inner: int):
    # block scales [R, C] -> one per weight [out, in]
    return jnp.repeat(jnp.repeat(scale, BLOCK, axis=0)[:out], BLOCK, axis=1)[:, :inner]


def dequantize_fp8(w: Fp8Weight, dtype=jnp.float32):
    """The float [out, in] matrix (computed in float32, then cast)."""
    values = w.values.astype(jnp.float32)
    scale = _expand(w.scale, *w.shape) if w.blocked else w.scale[:, None]
    return (values * scale).astype(dtype)


GEMV_MAX_ROWS = 16  # activation rows the Triton GEMV takes
# rows up to the policy's fp8_gemv.max_rows go through it: on the H200 it beat XLA's fused fp8 dot by 1.03-1.3x
# at one row and lost at 8 (per-channel 0.65-0.8x; docs/results/h200_fp8_gemv.json)
GEMV_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def fp8_linear(x, w: Fp8Weight):
    # x [N, in] @ w.T -> [N, out] in x's dtype, fp32 accumulation (module docstring: which path)
    if use_fp8_gemv(x, w):
        from ember.compiler.kernels.dense_gemv.kernel import (
            fp8_gemv,  # Triton is a GPU-only dependency: imported on use
        )

        return fp8_gemv(x, w)
    return fp8_linear_xla(x, w)


def fp8_linear_parts(x, w: Fp8Weight, sizes: tuple[int, ...]) -> tuple:
    # x [N, in] @ w.T split into the projections `sizes` packs by rows (q/k/v): the GEMV writes each its own
    # output (fp8_gemv_parts) where it takes x, else slices of the packed product
    if use_fp8_gemv(x, w):
        from ember.compiler.kernels.dense_gemv.kernel import fp8_gemv_parts

        return fp8_gemv_parts(x, w, tuple(sizes))
    return split_columns(fp8_linear_xla(x, w), sizes)


def fp8_linear_gate_up_silu(x, w: Fp8Weight):
    # silu(gate) * up of the packed gate/up projection x [N, in] @ w.T (w [2 ffn, in]) -> [N, ffn]: made in the
    # GEMV's epilogue where it takes x (fp8_gemv_gate_up), else fp8_linear_xla then the jnp activation
    if use_fp8_gemv(x, w):
        from ember.compiler.kernels.dense_gemv.kernel import fp8_gemv_gate_up

        return fp8_gemv_gate_up(x, w)
    return activation.gated_act_packed(fp8_linear_xla(x, w), act="silu")


def use_fp8_gemv(x, w: Fp8Weight) -> bool:
    """Whether fp8_linear(x, w) launches the Triton GEMV (decided at trace time; jit caches it)."""
    return (
        x.ndim == 2
        and 1 <= x.shape[0] <= min(GEMV_MAX_ROWS, kernel_policy().fp8_gemv.max_rows)
        and x.dtype in GEMV_DTYPES
        and w.shape[0] * w.shape[1] < 2**31
        and kernel_policy().fp8_gemv.enabled
        and triton_available()
    )


def fp8_linear_xla(x, w: Fp8Weight):
    # the plain jnp projection XLA fuses: x [N, in] @ w.T -> [N, out] in x's dtype, fp32 accumulation
    if w.blocked:
        operand = (w.values.astype(jnp.float32) * _expand(w.scale, *w.shape)).astype(x.dtype)
        return jnp.einsum("nk,ok->no", x, operand, preferred_element_type=jnp.float32).astype(x.dtype)
    y = jnp.einsum("nk,ok->no", x, w.values.astype(x.dtype), preferred_element_type=jnp.float32)
    return (y * w.scale[None, :]).astype(x.dtype)


def fp8_rows(w: Fp8Weight, ids):
    """Rows `ids` [N] of the matrix, dequantized to w.dtype: [N, in] (an embedding gather)."""
    values = jnp.take(w.values, ids, axis=0).astype(jnp.float32)
    if w.blocked:
        scale = jnp.repeat(jnp.take(w.scale, ids // BLOCK, axis=0), BLOCK, axis=1)[:, : w.shape[1]]
    else:
        scale = jnp.take(w.scale, ids, axis=0)[:, None]
    return (values * scale).astype(w.dtype or jnp.float32)


def fp8_reference_matmul(x, w: Fp8Weight) -> np.ndarray:
    """float64 x @ dequantized w.T on the host: what the tests compare fp8_linear with."""
    return np.asarray(x, np.float64) @ np.asarray(dequantize_fp8(w), np.float64).T
