"""Sums whose rounding depends on the summed axis only: the batch-invariant reductions of the deterministic
plans (docs/kernel_policy.md, "Batch invariance").

Why not jnp.sum / jnp.mean or a dot: XLA CPU picks their accumulation order (vectorisation, GEMV vs GEMM
kernels) from the whole operand shape, so the same row reduced inside a [N, ...] array and alone, or beside
a different number of rows, rounds differently (measured: a prefill chunk of 3 tokens vs 1 token in
attention; the per-head q/k RMSNorm of a [N, heads, dh] array once N reaches ~40 rows). Elementwise adds are
never reassociated, so a fixed pairwise tree of them depends on the length of the summed axis only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def fixed_order_sum(x, axis: int = 0):
    """Sum over `axis` as a fixed pairwise tree of elementwise adds: element i pairs with i + n/2, then again
    on the halves (an odd element out rides along to the next level). The axis is dropped."""
    axis = axis % x.ndim
    while x.shape[axis] > 1:
        n = x.shape[axis]
        half = n // 2
        paired = jax.lax.slice_in_dim(x, 0, half, axis=axis) + jax.lax.slice_in_dim(x, half, 2 * half, axis=axis)
        x = jnp.concatenate([paired, jax.lax.slice_in_dim(x, 2 * half, n, axis=axis)], axis) if n % 2 else paired
    return jnp.squeeze(x, axis)


def fixed_order_logsumexp(x, axis: int = -1):
    """log(sum(exp(x))) over `axis` (dropped) with the sum as `fixed_order_sum`: a row's value does not depend
    on how many rows are reduced beside it (XLA CPU's own reduction does from ~16 rows of a [R, V] array,
    measured). -inf for a row that is -inf everywhere, like jax.nn.logsumexp."""
    peak = jnp.max(x, axis=axis, keepdims=True)  # a max is exact in any order
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    return jnp.log(fixed_order_sum(jnp.exp(x - peak), axis)) + jnp.squeeze(peak, axis)


def fixed_order_log_softmax(x, axis: int = -1):
    """x - logsumexp(x) over `axis`, the sum in a fixed order (fixed_order_logsumexp)."""
    return x - jnp.expand_dims(fixed_order_logsumexp(x, axis), axis)
