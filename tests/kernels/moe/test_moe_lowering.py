"""compiler/kernels/moe/gpu.py on CPU: off the GPU the op is the reference; the decode kernels lower for sm_90 as
three native kernels (router, gate/up, down) at the MoE checkpoints' shapes; the launch plans' grids."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from triton_calls import triton_calls

from ember.compiler.kernels.moe import gpu, op
from ember.compiler.kernels.moe.decode_kernels import launch_plans

BF16 = jnp.bfloat16


def test_off_the_gpu_the_op_is_the_reference():
    rng = np.random.default_rng(0)
    e, d, f = 6, 16, 8
    x = jnp.asarray(rng.standard_normal((3, d)), jnp.float32)
    router = jnp.asarray(rng.standard_normal((e, d)), jnp.float32)
    gate, up = (jnp.asarray(rng.standard_normal((e, f, d)), jnp.float32) for _ in range(2))
    down = jnp.asarray(rng.standard_normal((e, d, f)), jnp.float32)
    np.testing.assert_array_equal(
        gpu.moe(x, router, gate, up, down, top_k=2, normalize=True),
        op.moe(x, router, gate, up, down, top_k=2, normalize=True),
    )


@pytest.mark.parametrize("rows, experts, top_k, d, f", [(1, 256, 8, 2048, 512), (16, 128, 8, 2048, 768)])
def test_decode_kernels_lower_to_three_native_kernels(rows, experts, top_k, d, f):
    x = jnp.zeros((rows, d), BF16)
    router = jnp.zeros((experts, d), BF16)
    gate = jnp.zeros((experts, f, d), BF16)
    down = jnp.zeros((experts, d, f), BF16)
    fn = lambda x, r, g, dn: gpu.moe_decode_triton(x, r, g, g, dn, top_k=top_k, normalize=True)  # noqa: E731
    calls = triton_calls(fn, x, router, gate, down)
    assert [c["name"] for c in calls] == ["moe_router_kernel", "moe_gate_up_kernel", "moe_down_kernel"]
    plans = launch_plans(rows, d, f, experts, top_k)
    for call, part in zip(calls, ("router", "gate_up", "down")):
        assert call["grid"] == tuple(plans[part]["grid"]) + (1,) * (3 - len(plans[part]["grid"]))


def test_launch_plans_refuse_more_choices_than_experts():
    with pytest.raises(ValueError, match="top_k"):
        launch_plans(1, 64, 32, 4, 5)


@pytest.mark.parametrize("rows, experts, f", [(512, 256, 512), (4096, 128, 768)])
def test_many_rows_lower_to_the_grouped_kernels(rows, experts, f, kernel_overrides, monkeypatch):
    d, top_k = 2048, 8
    x = jnp.zeros((rows, d), BF16)
    gate = jnp.zeros((experts, f, d), BF16)
    down = jnp.zeros((experts, d, f), BF16)
    router = jnp.zeros((experts, d), BF16)
    fn = lambda x, r, g, dn: gpu.moe(x, r, g, g, dn, top_k=top_k, normalize=True)  # noqa: E731
    kernel_overrides({"moe.gemv_max_rows": 16})
    monkeypatch.setattr(gpu, "triton_available", lambda: True)  # the op as traced for a GPU
    calls = triton_calls(fn, x, router, gate, down)
    assert [c["name"] for c in calls] == ["moe_grouped_gate_up_kernel", "moe_grouped_down_kernel"]
    tiles = -(-rows * top_k // (64 if rows * top_k >= 4 * 64 * experts else 16)) + experts
    assert calls[0]["grid"] == (tiles, f // 64, 1) and calls[1]["grid"] == (tiles, d // 64, 1)
