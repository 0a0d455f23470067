"""moe/grouped_kernels.py (the grouped GEMM over pairs sorted by expert) in Triton's CPU interpreter against
reference.experts: ragged groups of every size (one pair, more than a tile, none: experts left empty), the tile
map's unused tiles storing nothing, the K terms of a row combined in j order; and the tile map itself."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.moe import reference
from ember.compiler.kernels.moe.grouped_kernels import (
    launch_plan,
    moe_grouped_down_kernel,
    moe_grouped_gate_up_kernel,
    tile_map,
)

pytestmark = pytest.mark.interpret


def run_grouped_launches(x, weights, chosen, plan, experts: int, f: int, gate_up: tuple, down: tuple):
    """gpu._experts_grouped on host buffers: the tile map, the two launches (gate_up / down: the kernel and its
    weight arguments, host buffers) and the combine of each row's K terms."""
    n, d = x.shape
    top_k = chosen.shape[1]
    order, *tiles = (np.asarray(a) for a in tile_map(jnp.asarray(chosen), experts, plan["block_m"]))
    tiles = [HostBuffer(t) for t in tiles]
    m = n * top_k
    h = HostBuffer(np.full((m, f), np.nan, np.float32))
    gate_up[0][plan["gate_up"]["grid"]](
        HostBuffer(x), HostBuffer((order // top_k).astype(np.int32)), *tiles, *gate_up[1], h,
        **plan["gate_up"]["meta"],
    )  # fmt: skip
    y = HostBuffer(np.full((m, d), np.nan, np.float32))
    down[0][plan["down"]["grid"]](
        h, HostBuffer(weights.reshape(-1)[order]), *tiles, *down[1], y, **plan["down"]["meta"]
    )  # fmt: skip
    terms = np.zeros_like(y.array)
    terms[order] = y.array
    return terms.reshape(n, top_k, d).sum(1)


def run_grouped(x, weights, chosen, gate, up, down):
    experts, f, _ = gate.shape
    plan = launch_plan(x.shape[0], x.shape[1], f, experts, chosen.shape[1])
    gate_up = (moe_grouped_gate_up_kernel, (HostBuffer(gate), HostBuffer(up)))
    return run_grouped_launches(
        x, weights, chosen, plan, experts, f, gate_up, (moe_grouped_down_kernel, (HostBuffer(down),))
    )


@pytest.mark.parametrize(
    "rows, experts, top_k, skew", [pytest.param(5, 6, 2, False, marks=pytest.mark.slow), (20, 8, 2, True)]
)
def test_grouped_kernels_match_the_reference(rows, experts, top_k, skew):
    """skew: most pairs on expert 0 (a group longer than one tile of 16), experts 5.. never chosen."""
    rng = np.random.default_rng(rows)
    d, f = 24, 20
    x = rng.standard_normal((rows, d)).astype(np.float32)
    gate, up = ((rng.standard_normal((experts, f, d)) / np.sqrt(d)).astype(np.float32) for _ in range(2))
    down = (rng.standard_normal((experts, d, f)) / np.sqrt(f)).astype(np.float32)
    if skew:
        chosen = np.stack([[0, 1 + (i % 4)] for i in range(rows)]).astype(np.int32)
    else:
        chosen = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(rows)]).astype(np.int32)
    weights = rng.uniform(0.1, 1.0, (rows, top_k)).astype(np.float32)
    got = run_grouped(x, weights, chosen, gate, up, down)
    gate_up = jnp.concatenate([jnp.asarray(gate), jnp.asarray(up)], axis=1)
    want = np.asarray(
        reference.experts(jnp.asarray(x), jnp.asarray(weights), jnp.asarray(chosen), gate_up, jnp.asarray(down))
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_tile_map_covers_each_group_once():
    chosen = jnp.asarray([[3, 0], [3, 1], [3, 0], [3, 1], [3, 0]], jnp.int32)  # groups: 0: 3, 1: 2, 2: 0, 3: 5
    order, expert, start, size = (np.asarray(a) for a in tile_map(chosen, 4, 2))
    assert list(np.asarray(chosen).reshape(-1)[order]) == [0, 0, 0, 1, 1, 3, 3, 3, 3, 3]
    used = size > 0
    assert list(expert[used]) == [0, 0, 1, 3, 3, 3] and list(start[used]) == [0, 2, 3, 5, 7, 9]
    assert list(size[used]) == [2, 1, 2, 2, 2, 1] and len(size) == 5 + 4  # cdiv(10, 2) + experts
