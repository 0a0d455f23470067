"""The batch-invariant matmul's arithmetic in plain jnp: K cut into the config's splits, each split's product in
fp32 from zero, the splits added in order. What the kernel computes (to the dots' own rounding), and what an
h200 plan runs where no GPU traces it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .config import InvariantMatmulConfig


def split_bounds(k: int, config: InvariantMatmulConfig) -> list[tuple[int, int]]:
    return [(start, min(start + config.k_split, k)) for start in range(0, k, config.k_split)]


def fixed_order_partials_sum(partials: jax.Array) -> jax.Array:
    """partials [S, M, N] -> [M, N]: ((p0 + p1) + p2) + ..., the order the kernel's one-program form adds them."""
    total = partials[0]
    for s in range(1, partials.shape[0]):
        total = total + partials[s]
    return total


def invariant_matmul_reference(x: jax.Array, w: jax.Array, config: InvariantMatmulConfig, out_dtype=None):
    # x [M, K], w [N, K] in x's dtype (invariant_matmul casts it) -> [M, N] in out_dtype (x's dtype by default)
    parts = [
        jnp.einsum(
            "mk,nk->mn",
            x[:, a:b],
            w[:, a:b],
            preferred_element_type=jnp.float32,
            precision=jax.lax.Precision.HIGHEST,
        )
        for a, b in split_bounds(x.shape[1], config)
    ]
    return fixed_order_partials_sum(jnp.stack(parts)).astype(out_dtype or x.dtype)
