"""RMSNorm over the last axis, alone and fused with the residual add that precedes it (references).

Weights follow the GGUF convention: the multiplier is stored as is (a spec's `add_one` transform folds a 1 + w norm in at load).
"""

import jax
import jax.numpy as jnp

from ember.compiler.kernels.split_k import materialized


def rms_norm(x, weight, *, eps):
    # x [..., n], weight [n]; statistics in fp32 whatever the activation dtype
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def add_rms_norm(x, y, weight, *, eps):
    # -> (x + y, rms_norm(x + y)): the sum is the new residual stream (y None: nothing to add, as before a
    # plan's first layer: passes/defer_residual_add.py; split-K partials: summed first, split_k.py)
    s = x if y is None else x + materialized(y)
    return s, rms_norm(s, weight, eps=eps)
