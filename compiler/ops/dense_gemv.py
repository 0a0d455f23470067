"""Decode GEMV for plain float weights (bf16 checkpoints on a GPU target): the FP8 GEMV's Triton kernels
(quant/fp8_gemv.py) reading an unscaled bf16 / f16 / f32 matrix, at one activation row.

Why: at one row XLA runs a bf16 projection as a split-K GEMM fusion plus kernels after it, and each costs a
launch in the step. On the 8B bf16 step (H200, 5f2d856) the GEMMs streamed 3.2-4.2 TB/s and left behind per
layer: a split-K sum after q/k/v and after o and down (123 us per step), a split of the packed q/k/v into
three arrays for the RoPE-fused attention (36 us) and silu(gate) * up (46 us). The GEMV writes one output
per projection (fp8_gemv_parts_kernel), silu(gate) * up in the gate/up projection's epilogue, and needs no
K split at these shapes (its programs own whole rows), so none of those kernels runs.

Dispatch (`use_dense_gemv`, read at trace time): a 2-D x of 1..DISPATCH_MAX_ROWS rows (EMBER_DENSE_GEMV_ROWS)
in bf16 / f16 / f32, a 2-D float weight with out * in < 2**31 and fewer than EMBER_DENSE_GEMV_MAX_OUT rows
(default: any), Triton available (a GPU trace), and EMBER_DENSE_GEMV not "0". Everything else keeps the
reference op (XLA's GEMM).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from .env_config import overridden
from .quant.fp8_gemv_config import Fp8GemvConfig
from .triton_available import triton_available

DISPATCH_MAX_ROWS = int(os.environ.get("EMBER_DENSE_GEMV_ROWS", "1"))
WEIGHT_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


@dataclass(frozen=True)
class DenseRule:
    """Applies when out < max_out (first match wins)."""

    config: Fp8GemvConfig
    max_out: int = 1 << 62


_C = Fp8GemvConfig
# CUDA-core byte loop (step_reduce: a small accumulator), one K split; a step's tile block_n x block_k x 2
# bytes, twice that in flight with the register prefetch. Best guesses until the H200 A/B measures them.
DENSE_RULES: tuple[DenseRule, ...] = (
    DenseRule(_C(block_n=4, block_k=512, step_reduce=True)),
)


def pick_dense_config(m: int, out: int, inner: int, *, blocked: bool = False,
                      rules: tuple[DenseRule, ...] = DENSE_RULES) -> Fp8GemvConfig:
    """The first matching rule's config; EMBER_DENSE_GEMV_CONFIG ("block_n=8/block_k=1024") overrides
    fields (read at trace time, for side-by-side measurements)."""
    del m, inner, blocked  # one table for every row count and depth for now
    for rule in rules:
        if out < rule.max_out:
            return overridden(rule.config, "EMBER_DENSE_GEMV_CONFIG")
    return overridden(Fp8GemvConfig(step_reduce=True), "EMBER_DENSE_GEMV_CONFIG")


def use_dense_gemv(x, w) -> bool:
    """Whether x @ w.T runs the dense GEMV (see module docstring)."""
    return (x.ndim == 2 and 1 <= x.shape[0] <= DISPATCH_MAX_ROWS and x.dtype in WEIGHT_DTYPES
            and getattr(w, "ndim", 0) == 2 and w.dtype in WEIGHT_DTYPES and w.shape[0] * w.shape[1] < 2**31
            and w.shape[0] < int(os.environ.get("EMBER_DENSE_GEMV_MAX_OUT", 1 << 62))
            and os.environ.get("EMBER_DENSE_GEMV", "1") != "0" and triton_available())


def _weight_and_config(x, w):
    from .quant.fp8_gemv import GemvWeight, checked_config  # Triton is a GPU-only dependency: imported on use

    weight = GemvWeight(w, None)
    return weight, checked_config(x, weight, None, pick_dense_config)


def dense_gemv(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [m, in] @ w.T (w [out, in]) -> [m, out] in x's dtype, fp32 accumulation."""
    from .quant.fp8_gemv import gemv

    weight, config = _weight_and_config(x, w)
    return gemv(x, weight, config)


def dense_gemv_parts(x: jax.Array, w: jax.Array, sizes: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """x @ w.T split into the projections of `sizes` (w packs them by rows), each written by the kernel."""
    from .quant.fp8_gemv import gemv_parts

    weight, config = _weight_and_config(x, w)
    return gemv_parts(x, weight, tuple(sizes), config)


def dense_gemv_gate_up(x: jax.Array, w: jax.Array) -> jax.Array:
    """silu(gate) * up of the packed gate/up projection x @ w.T (w [2 ffn, in]) -> [m, ffn], made in the
    GEMV's epilogue."""
    from .quant.fp8_gemv import gemv_gate_up

    weight, config = _weight_and_config(x, w)
    return gemv_gate_up(x, weight, config)
