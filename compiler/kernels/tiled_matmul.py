"""Matmuls on XLA whose row results do not depend on how many rows there are (the deterministic cpu plans,
docs/kernel_policy.md "Batch invariance"): the rows go through one GEMM shape, TILE rows at a time inside a
loop, so every row is computed by the same executable body whatever N is.

Why: XLA CPU picks its GEMM from the whole operand shape. Measured (jax 0.11.2): a one-wide output over
k = 2,048 rounds a row differently from 8 rows up, and the MoE's ragged matmul from 17 rows; a tiled GEMM gave a
row the same bits at every N from 1 to 70 for outputs 4 to 1,536 wide, at any position in its tile.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TILE = 16


def tiled_matmul(x, w):
    """x [N, k] @ w [k, o] -> [N, o] in float32, TILE rows per GEMM."""
    n = x.shape[0]
    # at least two trips: XLA compiles a one-trip loop without the loop, fusing its body (a transposed
    # weight's layout, measured) unlike the loop's, and the rows' bits moved between one tile and several
    tiles = max(2, -(-n // TILE))
    padded = jnp.pad(x.astype(jnp.float32), ((0, tiles * TILE - n), (0, 0))).reshape(tiles, TILE, -1)
    wf = w.astype(jnp.float32)
    return jax.lax.map(lambda rows: rows @ wf, padded).reshape(tiles * TILE, -1)[:n]
