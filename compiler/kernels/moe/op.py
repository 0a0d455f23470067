"""The `moe` op as a plan calls it: stacked per-expert gate, up and down weights (GGUF's ffn_*_exps layout),
routed through the references in reference.py.

x [N, d]; router [E, d]; gate, up [E, f, d]; down [E, d, f] -> [N, d] in x's dtype. An expert stack kept packed
(packed.py) is dequantized to x's dtype first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.activation import gated_act_packed
from ember.compiler.kernels.fixed_order import fixed_order_sum
from ember.compiler.kernels.tiled_matmul import TILE, tiled_matmul

from .packed import dense_experts
from .reference import experts, route


def moe(x, router, gate, up, down, *, top_k: int, normalize: bool, act: str = "silu"):
    gate, up, down = (dense_experts(w, x.dtype) for w in (gate, up, down))  # stacks kept packed (packed.py)
    weights, chosen = route(x, router, top_k=int(top_k), normalize=bool(normalize))
    gate_up = jnp.concatenate([gate, up], axis=1)  # [E, 2f, d]: gate rows first, as experts() reads them
    return experts(x, weights, chosen, gate_up, down, act=act)


def moe_invariant(x, router, gate, up, down, *, top_k: int, normalize: bool, act: str = "silu"):
    """The deterministic plans' `moe` on XLA: a token's bits do not depend on how many tokens the step holds.
    The router and every expert projection run as fixed-shape GEMMs (tiled_matmul.py: XLA's ragged matmul
    rounded a row differently from 17 rows), the softmax, the top-k renormalisation and the weighted
    combine sum in a fixed order (fixed_order.py)."""
    gate, up, down = (dense_experts(w, x.dtype) for w in (gate, up, down))
    logits = tiled_matmul(x, router.T)  # [N, E] fp32
    probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    probs = probs / fixed_order_sum(probs, axis=-1)[:, None]
    weights, chosen = jax.lax.top_k(probs, int(top_k))
    if normalize:
        weights = weights / fixed_order_sum(weights, axis=-1)[:, None]
    outputs = _experts_in_tiles(x, chosen.astype(jnp.int32), jnp.concatenate([gate, up], axis=1), down, act)
    return fixed_order_sum(weights[:, :, None] * outputs, axis=1).astype(x.dtype)


def _experts_in_tiles(x, chosen, gate_up, down, act):
    """x [N, d], chosen [N, k], gate_up [E, 2f, d], down [E, d, f] -> [N, k, d] fp32: the token-expert pairs
    sorted by expert, each expert's group cut into tiles of TILE pairs (the last one padded), one [TILE, d]
    GEMM per tile and projection with that tile's expert's weights."""
    n, k = chosen.shape
    num_experts, pairs = gate_up.shape[0], n * k
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # sorted position -> pair (token p // k, its j = p % k)
    sizes = jnp.bincount(flat, length=num_experts)
    group_start = jnp.cumsum(sizes) - sizes
    tile_end = jnp.cumsum(-(-sizes // TILE))
    max_tiles = -(-pairs // TILE) + min(num_experts, pairs)  # each non-empty group adds at most one part-tile
    t = jnp.arange(max_tiles)
    expert = jnp.minimum(jnp.searchsorted(tile_end, t, side="right"), num_experts - 1)  # [T]
    tile_first = tile_end[expert] - (-(-sizes[expert] // TILE))
    local = (t - tile_first)[:, None] * TILE + jnp.arange(TILE)[None]  # [T, TILE]: index inside the group
    valid = (t < tile_end[-1])[:, None] & (local < sizes[expert][:, None])
    pair = order[jnp.where(valid, group_start[expert][:, None] + local, 0)]
    rows = x.astype(jnp.float32)[pair // k]  # [T, TILE, d]

    def tile(args):
        xs, e = args
        h = xs @ gate_up[e].astype(jnp.float32).T  # [TILE, 2f]
        return gated_act_packed(h, act=act) @ down[e].astype(jnp.float32).T  # [TILE, d]

    y = jax.lax.map(tile, (rows, expert))
    out = jnp.zeros((pairs, x.shape[1]), jnp.float32).at[jnp.where(valid, pair, pairs)].set(y, mode="drop")
    return out.reshape(n, k, -1)
