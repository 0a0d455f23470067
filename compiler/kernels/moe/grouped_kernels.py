"""Mixture-of-Experts for steps of many rows (prefill, large decode batches): a grouped GEMM over the (token,
expert) pairs sorted by expert, ragged groups with no padding to a capacity, as two Triton kernels. The GPU twin of
reference.experts's two ragged_dot calls.

The pairs' order and the tile map come from `tile_map` (jnp): pair p = (token p // K, its j-th choice) sorted
stably by expert; each expert's run of pairs cut into tiles of BM pairs; tile t -> (expert, first sorted pair,
pairs in it). The grid has the static upper bound cdiv(M, BM) + E tiles (M = rows * K); tiles past the real
count hold 0 pairs and store nothing.

- moe_grouped_gate_up_kernel, grid (tiles, F / BN): x's rows of a tile's pairs (gathered by token) against the
  tile's expert's gate and up rows -> h_sorted [M, F] = silu(gate) * up, fp32.
- moe_grouped_down_kernel, grid (tiles, D / BN): h_sorted's rows against the expert's down rows, times each
  pair's routing weight -> y_sorted [M, D], fp32. The caller puts the rows back in (token, j) order and adds
  the K terms in j order: a row's sum does not depend on which other rows share its tiles.
"""

from __future__ import annotations

import jax.numpy as jnp
import triton
import triton.language as tl


@triton.jit
def _tile_pairs(
    tile_expert_ptr, tile_start_ptr, tile_size_ptr, N: tl.constexpr, E: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr
):
    """This program's tile: its expert (int64, clamped for unused tiles), first sorted pair `start`, the tile's
    rows r [BM] with ok_r (r < the pairs in it), and its output columns n [BN] of N with ok_n."""
    tile = tl.program_id(0)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    ok_n = n < N
    expert = tl.minimum(tl.load(tile_expert_ptr + tile), E - 1).to(tl.int64)
    start = tl.load(tile_start_ptr + tile)
    size = tl.load(tile_size_ptr + tile)
    r = tl.arange(0, BM)
    ok_r = r < size
    return expert, start, r, ok_r, n, ok_n


@triton.jit
def moe_grouped_gate_up_kernel(
    x_ptr,  # [rows, D]
    token_ptr,  # [M] int32: the token of each sorted pair
    tile_expert_ptr,  # [T] int32
    tile_start_ptr,  # [T] int32: first sorted pair of the tile
    tile_size_ptr,  # [T] int32: pairs in it (0: an unused tile)
    gate_ptr,  # [E, F, D]
    up_ptr,  # [E, F, D]
    h_ptr,  # [M, F] fp32
    D: tl.constexpr,
    F: tl.constexpr,
    E: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    expert, start, r, ok_r, n, ok_n = _tile_pairs(tile_expert_ptr, tile_start_ptr, tile_size_ptr, F, E, BM, BN)
    token = tl.load(token_ptr + start + r, mask=ok_r, other=0)
    acc_g = tl.zeros([BM, BN], tl.float32)
    acc_u = tl.zeros([BM, BN], tl.float32)
    base = expert * F * D + n[None, :] * D
    for k0 in range(0, D, BK):
        k = k0 + tl.arange(0, BK)
        ok_k = k < D
        x = tl.load(x_ptr + token[:, None] * D + k[None, :], mask=ok_r[:, None] & ok_k[None, :], other=0.0)
        ok_w = ok_k[:, None] & ok_n[None, :]
        wg = tl.load(gate_ptr + base + k[:, None], mask=ok_w, other=0.0)  # [BK, BN]
        wu = tl.load(up_ptr + base + k[:, None], mask=ok_w, other=0.0)
        acc_g = tl.dot(x.to(wg.dtype), wg, acc_g)
        acc_u = tl.dot(x.to(wu.dtype), wu, acc_u)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + (start + r)[:, None] * F + n[None, :], h, mask=ok_r[:, None] & ok_n[None, :])


@triton.jit
def moe_grouped_down_kernel(
    h_ptr,  # [M, F] fp32
    weight_ptr,  # [M] fp32: the routing weight of each sorted pair
    tile_expert_ptr,
    tile_start_ptr,
    tile_size_ptr,
    down_ptr,  # [E, D, F]
    y_ptr,  # [M, D] fp32
    D: tl.constexpr,
    F: tl.constexpr,
    E: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    expert, start, r, ok_r, n, ok_n = _tile_pairs(tile_expert_ptr, tile_start_ptr, tile_size_ptr, D, E, BM, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    base = expert * D * F + n[None, :] * F
    for k0 in range(0, F, BK):
        k = k0 + tl.arange(0, BK)
        ok_k = k < F
        h = tl.load(h_ptr + (start + r)[:, None] * F + k[None, :], mask=ok_r[:, None] & ok_k[None, :], other=0.0)
        w = tl.load(down_ptr + base + k[:, None], mask=ok_k[:, None] & ok_n[None, :], other=0.0)  # [BK, BN]
        acc = tl.dot(h.to(w.dtype), w, acc)
    weight = tl.load(weight_ptr + start + r, mask=ok_r, other=0.0)
    tl.store(y_ptr + (start + r)[:, None] * D + n[None, :], acc * weight[:, None], mask=ok_r[:, None] & ok_n[None, :])


def tile_map(chosen, experts: int, block_m: int):
    """chosen [rows, K] int32 -> (order [M]: sorted pair -> pair index, tile_expert, tile_start, tile_size [T]),
    T = cdiv(M, block_m) + experts (a static bound on the tiles the ragged groups need)."""
    pairs = chosen.reshape(-1).astype(jnp.int32)
    m = pairs.shape[0]
    order = jnp.argsort(pairs, stable=True).astype(jnp.int32)
    sizes = jnp.bincount(pairs, length=experts).astype(jnp.int32)
    starts = jnp.cumsum(sizes) - sizes
    tiles = (sizes + block_m - 1) // block_m
    tile_ends = jnp.cumsum(tiles)
    count = -(-m // block_m) + experts
    t = jnp.arange(count, dtype=jnp.int32)
    expert = jnp.searchsorted(tile_ends, t, side="right").astype(jnp.int32)  # experts with no tiles skipped
    safe = jnp.minimum(expert, experts - 1)
    local = t - (tile_ends[safe] - tiles[safe])
    start = starts[safe] + local * block_m
    size = jnp.where(expert < experts, jnp.clip(sizes[safe] - local * block_m, 0, block_m), 0)
    return order, expert, jnp.where(size > 0, start, 0).astype(jnp.int32), size.astype(jnp.int32)


def launch_plan(rows: int, d: int, f: int, experts: int, top_k: int) -> dict:
    """Tiles (static bound), block sizes and warps of both kernels."""
    block_m = 64 if rows * top_k >= 4 * 64 * experts else 16  # most groups small: few wasted rows per tile
    tiles = -(-rows * top_k // block_m) + experts
    meta = dict(E=experts, BM=block_m, BN=64, BK=64)
    return {
        "block_m": block_m,
        "gate_up": {"grid": (tiles, triton.cdiv(f, 64)), "num_warps": 4, "meta": dict(D=d, F=f, **meta)},
        "down": {"grid": (tiles, triton.cdiv(d, 64)), "num_warps": 4, "meta": dict(D=d, F=f, **meta)},
    }
