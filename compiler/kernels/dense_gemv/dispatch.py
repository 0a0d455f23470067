"""Decode GEMV for plain float weights (bf16 checkpoints on a GPU target): the FP8 GEMV's Triton kernels
(dense_gemv/kernel.py) reading an unscaled bf16 / f16 / f32 matrix, at one activation row.

Why: at one row XLA runs a bf16 projection as a split-K GEMM fusion plus kernels after it, and each costs a
launch in the step. On the 8B bf16 step (H200) the GEMMs streamed 3.2-4.2 TB/s and left behind per
layer: a split-K sum after q/k/v and after o and down (123 us per step), a split of the packed q/k/v into
three arrays for the RoPE-fused attention (36 us) and silu(gate) * up (46 us). The GEMV writes one output
per projection (fp8_gemv_parts_kernel), silu(gate) * up in the gate/up projection's epilogue, and needs no
K split at these shapes (its programs own whole rows), so none of those kernels runs. XLA's GEMMs stream
close to the HBM read rate on the large matrices, so the kernel pays only where the kernels it removes cost
more than it loses: measured per shape (DENSE_RULES).

Dispatch (`use_dense_gemv`, the kernel policy's dense_gemv fields read at trace time): the family enabled, a
2-D x of 1..max_rows rows in bf16 / f16 / f32, a 2-D float weight with out * in < 2**31 and fewer than max_out
rows (None: any) whose shape has a config in DENSE_RULES, and Triton available (a GPU trace). Everything else
keeps the reference op (XLA's GEMM).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.config_override import overridden
from ember.compiler.kernels.dense_gemv.config import Fp8GemvConfig, Fp8Rule
from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy

WEIGHT_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


_C = Fp8GemvConfig
# where no rule gives a config: an override (the policy's dense_gemv.config) or a direct call starts from this one
DEFAULT_CONFIG = _C(step_reduce=True)
# Measured in the 8B bf16 step alone at one row (H200, docs/results/h200_dense_gemv_0130688.json;
# each kernel's time per call in the step, against XLA's GEMM plus the kernels after it): only the shapes with
# `in` = 4096 are measured; everything else keeps XLA's GEMM.
DENSE_RULES: tuple[Fp8Rule, ...] = (
    # the LM head (128256 x 4096): tensor-core tiles, cp.async stages: 230.5 us vs XLA's 236.9
    Fp8Rule(_C(block_n=64, block_k=128, use_dot=True, num_stages=4), min_out=65536, min_in=4096, max_in=4097),
    # packed gate/up (28672 x 4096), silu(gate) * up in the epilogue: 55.7 us vs XLA's 54.9 + 1.4 (the multiply)
    Fp8Rule(_C(block_n=64, block_k=256, use_dot=True, num_stages=3), min_out=16384, min_in=4096, max_in=4097),
    # packed q/k/v (6144 x 4096, three outputs) and o (4096 x 4096): CUDA cores, two rows per program over all of
    # `in`: 15.2 and 10.9 us vs XLA's 14.6 + 1.4 (split-K sum) + 1.2 (split) and 10.4 + 1.4 (split-K sum)
    Fp8Rule(_C(block_n=2, block_k=1024, step_reduce=True), min_out=4096, min_in=4096, max_in=4097),
    # the down projection (4096 x 14336): XLA's split-K GEMM + sum 30.0 us vs the best GEMV's 31.3
    Fp8Rule(None),
)


def pick_dense_config(
    m: int, out: int, inner: int, *, blocked: bool = False, rules: tuple[Fp8Rule, ...] = DENSE_RULES
) -> Fp8GemvConfig | None:
    """The first matching rule's config (None: XLA's GEMM). The policy's dense_gemv.config ({"block_n": 8})
    overrides fields of a picked config, or of the default config where the table says XLA (read at trace
    time, for side-by-side measurements)."""
    del blocked  # plain weights have no scale layout
    config = next((rule.config for rule in rules if rule.matches(m, out, inner)), None)
    override = kernel_policy().dense_gemv.config
    if config is None and not override:
        return None
    return overridden(config or DEFAULT_CONFIG, override, "dense_gemv.config")


def use_dense_gemv(x, w) -> bool:
    """Whether x @ w.T runs the dense GEMV (see module docstring)."""
    policy = kernel_policy().dense_gemv
    return (
        policy.enabled
        and x.ndim == 2
        and 1 <= x.shape[0] <= policy.max_rows
        and x.dtype in WEIGHT_DTYPES
        and getattr(w, "ndim", 0) == 2
        and w.dtype in WEIGHT_DTYPES
        and w.shape[0] * w.shape[1] < 2**31
        and (policy.max_out is None or w.shape[0] < policy.max_out)
        and triton_available()
        and pick_dense_config(x.shape[0], *w.shape) is not None
    )


def _weight_and_config(x, w):
    from ember.compiler.kernels.dense_gemv.kernel import (  # Triton is a GPU-only dependency: imported on use
        GemvWeight,
        checked_config,
    )

    weight = GemvWeight(w, None)
    # a shape the table leaves to XLA (a direct call, not the dispatch) runs the default CUDA-core config
    config = pick_dense_config(x.shape[0], *weight.shape) or DEFAULT_CONFIG
    return weight, checked_config(x, weight, config, pick_dense_config)


def dense_gemv(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [m, in] @ w.T (w [out, in]) -> [m, out] in x's dtype, fp32 accumulation."""
    from ember.compiler.kernels.dense_gemv.kernel import gemv

    weight, config = _weight_and_config(x, w)
    return gemv(x, weight, config)


def dense_gemv_parts(x: jax.Array, w: jax.Array, sizes: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """x @ w.T split into the projections of `sizes` (w packs them by rows), each written by the kernel."""
    from ember.compiler.kernels.dense_gemv.kernel import gemv_parts

    weight, config = _weight_and_config(x, w)
    return gemv_parts(x, weight, tuple(sizes), config)


def dense_gemv_gate_up(x: jax.Array, w: jax.Array) -> jax.Array:
    """silu(gate) * up of the packed gate/up projection x @ w.T (w [2 ffn, in]) -> [m, ffn], made in the
    GEMV's epilogue."""
    from ember.compiler.kernels.dense_gemv.kernel import gemv_gate_up

    weight, config = _weight_and_config(x, w)
    return gemv_gate_up(x, weight, config)
