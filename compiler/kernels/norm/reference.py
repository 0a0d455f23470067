"""RMSNorm over the last axis, alone and fused with the residual add that precedes it (references), and
their batch-invariant forms for the deterministic plans (the mean of squares as a fixed-order sum).

Weights follow the GGUF convention: the multiplier is stored as is (a spec's `add_one` transform folds a 1 + w norm in at load).
"""

import jax
import jax.numpy as jnp

from ember.compiler.kernels.fixed_order import fixed_order_sum
from ember.compiler.kernels.split_k import materialized


def rms_norm(x, weight, *, eps):
    # x [..., n], weight [n]; statistics in fp32 whatever the activation dtype
    xf = x.astype(jnp.float32)
    return _scaled(xf, jnp.mean(xf * xf, axis=-1, keepdims=True), weight, eps, x.dtype)


def add_rms_norm(x, y, weight, *, eps):
    # -> (x + y, rms_norm(x + y)): the sum is the new residual stream (y None: nothing to add, as before a
    # plan's first layer: passes/defer_residual_add.py; split-K partials: summed first, split_k.py)
    s = _residual(x, y)
    return s, rms_norm(s, weight, eps=eps)


def rms_norm_invariant(x, weight, *, eps):
    # rms_norm with the mean of squares summed in a fixed order (fixed_order.py): a row's bits do not depend
    # on how many rows (or heads beside it) the array holds
    xf = x.astype(jnp.float32)
    mean_square = fixed_order_sum(xf * xf, axis=-1)[..., None] / xf.shape[-1]
    return _scaled(xf, mean_square, weight, eps, x.dtype)


def add_rms_norm_invariant(x, y, weight, *, eps):
    s = _residual(x, y)
    return s, rms_norm_invariant(s, weight, eps=eps)


def _residual(x, y):
    return x if y is None else x + materialized(y)


def _scaled(xf, mean_square, weight, eps, dtype):
    return (xf * jax.lax.rsqrt(mean_square + eps) * weight.astype(jnp.float32)).astype(dtype)
