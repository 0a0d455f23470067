"""The batch-invariant matmul's config and jnp form (compiler/kernels/invariant_matmul/): split sizes follow the
weight's shape only, the jnp form equals a float64 product to fp32 rounding, and its partials add in split order."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.kernels.invariant_matmul.config import TARGET_PROGRAMS, pick_config
from ember.compiler.kernels.invariant_matmul.matmul import invariant_matmul
from ember.compiler.kernels.invariant_matmul.reference import fixed_order_partials_sum, split_bounds

# (n, k): the 1.5B's q/k/v, o, gate/up, down and head; the 8B's q/k/v, gate/up, down
SHAPES = [
    (2048, 1536),
    (1536, 1536),
    (17920, 1536),
    (1536, 8960),
    (151936, 1536),
    (6144, 4096),
    (28672, 4096),
    (4096, 14336),
]


@pytest.mark.parametrize("n, k", SHAPES)
def test_config_follows_the_weight_only(n, k):
    config = pick_config(n, k)
    assert config.k_split % config.block_k == 0
    bounds = split_bounds(k, config)
    assert bounds[0][0] == 0 and bounds[-1][1] == k
    assert all(a < b for a, b in bounds) and all(b == a2 for (_, b), (a2, _) in zip(bounds, bounds[1:]))
    tiles = -(-n // config.block_n)
    # enough programs for one row, or K already cut to the smallest split
    assert tiles * len(bounds) >= TARGET_PROGRAMS or config.k_split in (256, 64 * -(-k // 64))


def test_partials_add_in_split_order():
    # values chosen so that float32 addition order shows: (1e8 + 1) - 1e8 = 0 but 1e8 + (1 - 1e8) = 1
    parts = jnp.asarray(np.array([1e8, 1.0, -1e8], np.float32).reshape(3, 1, 1))
    assert float(fixed_order_partials_sum(parts)[0, 0]) == 0.0


@pytest.mark.parametrize("rows, n, k", [(1, 96, 1000), (5, 130, 1536), (33, 64, 700)])
def test_jnp_form_matches_float64(rows, n, k):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    got = np.asarray(invariant_matmul(jnp.asarray(x), jnp.asarray(w)))
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert got.shape == (rows, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
