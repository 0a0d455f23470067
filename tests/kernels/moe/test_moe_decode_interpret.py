"""moe/decode_kernels.py in Triton's CPU interpreter against moe/reference.py: the router (softmax, top-k with
ties, renormalised or not) equal in its choices and within float rounding in its weights; the expert GEMVs and
the fixed-order combine against reference.experts given the same routing; every expert count smaller than
rows * k (experts left empty) and larger."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from interpreter import HostBuffer

from ember.compiler.kernels.moe import reference
from ember.compiler.kernels.moe.decode_kernels import (
    launch_plans,
    moe_down_kernel,
    moe_gate_up_kernel,
    moe_router_kernel,
)

pytestmark = pytest.mark.interpret


def run_router(x, router, top_k, normalize):
    n, d = x.shape
    plan = launch_plans(n, d, 1, router.shape[0], top_k)["router"]
    weights = HostBuffer(np.zeros((n, top_k), np.float32))
    experts = HostBuffer(np.zeros((n, top_k), np.int32))
    moe_router_kernel[plan["grid"]](
        HostBuffer(x), HostBuffer(router), weights, experts, NORMALIZE=normalize, **plan["meta"]
    )
    return weights.array, experts.array


def run_experts(x, weights, chosen, gate, up, down):
    n, d = x.shape
    top_k = chosen.shape[1]
    e, f, _ = gate.shape
    plans = launch_plans(n, d, f, e, top_k)
    pairs = HostBuffer(chosen.reshape(-1).astype(np.int32))
    h = HostBuffer(np.zeros((n * top_k, f), np.float32))
    moe_gate_up_kernel[plans["gate_up"]["grid"]](
        HostBuffer(x), pairs, HostBuffer(gate), HostBuffer(up), h, **plans["gate_up"]["meta"]
    )
    out = HostBuffer(np.zeros((n, d), x.dtype))
    moe_down_kernel[plans["down"]["grid"]](
        h, pairs, HostBuffer(weights.reshape(-1)), HostBuffer(down), out, **plans["down"]["meta"]
    )
    return out.array


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 3),
    experts=st.sampled_from([4, 6, 8]),
    top_k=st.integers(1, 3),
    normalize=st.booleans(),
    tied=st.booleans(),
)
def test_router_kernel_matches_reference(seed, rows, experts, top_k, normalize, tied):
    """tied: experts 1 and 2 (and 3 and 4 when there are) share a router row, so their probabilities are equal
    to the bit: the lower index must come first, as in the reference."""
    rng = np.random.default_rng(seed)
    d = 24
    x = rng.standard_normal((rows, d)).astype(np.float32)
    router = rng.standard_normal((experts, d)).astype(np.float32)
    if tied:
        router[2] = router[1]
        router[4 % experts] = router[3]
    weights, chosen = run_router(x, router, top_k, normalize)
    want_w, want_e = reference.route(jnp.asarray(x), jnp.asarray(router), top_k=top_k, normalize=normalize)
    np.testing.assert_array_equal(chosen, np.asarray(want_e))
    np.testing.assert_allclose(weights, np.asarray(want_w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "rows, experts, top_k, d, f, dtype",
    [
        pytest.param(1, 4, 2, 32, 16, "float32", marks=pytest.mark.slow),
        (3, 8, 2, 24, 40, "float32"),
        (2, 16, 4, 48, 32, "bfloat16"),
    ],
)
def test_expert_kernels_match_the_grouped_reference(rows, experts, top_k, d, f, dtype):
    rng = np.random.default_rng(rows * experts)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    x = rng.standard_normal((rows, d)).astype(np_dtype)
    gate, up = ((rng.standard_normal((experts, f, d)) / np.sqrt(d)).astype(np_dtype) for _ in range(2))
    down = (rng.standard_normal((experts, d, f)) / np.sqrt(f)).astype(np_dtype)
    chosen = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(rows)]).astype(np.int32)
    weights = rng.uniform(0.1, 1.0, (rows, top_k)).astype(np.float32)
    got = run_experts(x, weights, chosen, gate, up, down).astype(np.float32)
    gate_up = jnp.concatenate([jnp.asarray(gate), jnp.asarray(up)], axis=1)
    want = reference.experts(jnp.asarray(x), jnp.asarray(weights), jnp.asarray(chosen), gate_up, jnp.asarray(down))
    want = np.asarray(want, np.float32)
    tol = 1e-5 if dtype == "float32" else 2**-7
    assert np.max(np.abs(got - want) / (np.abs(want) + 1e-2)) <= tol


def test_router_kernel_breaks_a_full_tie_by_expert_index():
    """Every router row equal: every probability 1 / E, the first k experts chosen in order, weights 1 / k."""
    rng = np.random.default_rng(0)
    router = np.tile(rng.standard_normal((1, 16)).astype(np.float32), (6, 1))
    weights, chosen = run_router(rng.standard_normal((2, 16)).astype(np.float32), router, 3, True)
    np.testing.assert_array_equal(chosen, [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_allclose(weights, 1 / 3, rtol=1e-6)
