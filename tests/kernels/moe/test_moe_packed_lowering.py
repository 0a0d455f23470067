"""compiler/kernels/moe/gpu.py with expert stacks kept packed (moe/packed.py), on CPU: off the GPU the op is the
reference on the stacks dequantized; traced for a GPU, a decode step lowers for sm_90 to the router and the two
packed GEMVs (one launch per projection pair, every format), a step of many rows to the packed grouped GEMM (no
stack dequantized), or with moe.grouped off to the reference on the stacks dequantized in the step."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from triton_calls import triton_calls

from ember.compiler.kernels.gguf_gemv.layout import FORMATS, QuantizedWeight, random_gguf_bytes
from ember.compiler.kernels.moe import gpu, op
from ember.compiler.kernels.moe.packed import dense_experts, dequantize_experts, pack_experts
from ember.compiler.kernels.moe.packed_grouped_kernels import launch_plan as packed_grouped_plan
from ember.compiler.kernels.moe.packed_grouped_kernels import stack_args
from ember.compiler.kernels.moe.packed_kernels import launch_plans

BF16 = jnp.bfloat16


def zero_stack(fmt: str, shape: tuple[int, int, int]) -> QuantizedWeight:
    """An all-zero packed [E, out, in] stack (planes of the layout's dtypes and shapes, nothing drawn)."""
    experts, out, inner = shape
    block = FORMATS[fmt][0]
    one = pack_experts(random_gguf_bytes(np.random.default_rng(0), fmt, (1, block)), fmt, (1, 1, block))
    planes = {name: jnp.zeros((experts, inner // block, out, *p.shape[3:]), p.dtype) for name, p in one.planes.items()}
    return QuantizedWeight(planes, fmt, shape)


def test_off_the_gpu_the_op_is_the_reference_on_dequantized_stacks():
    rng = np.random.default_rng(0)
    e, d, f = 4, 256, 256
    stacks = [
        pack_experts(random_gguf_bytes(rng, fmt, (e * rows, cols), realistic=True), fmt, (e, rows, cols))
        for fmt, rows, cols in (("q4_k", f, d), ("q4_k", f, d), ("q6_k", d, f))
    ]
    x = jnp.asarray(rng.standard_normal((3, d)) * 0.05, jnp.float32)
    router = jnp.asarray(rng.standard_normal((e, d)), jnp.float32)
    dense = [dequantize_experts(s) for s in stacks]
    got = gpu.moe(x, router, *stacks, top_k=2, normalize=True)
    np.testing.assert_array_equal(got, op.moe(x, router, *dense, top_k=2, normalize=True))
    assert np.abs(np.asarray(got)).max() > 0


@pytest.mark.parametrize(
    "formats, experts, d, f", [(("q4_k", "q4_k", "q6_k"), 16, 2048, 768), (("q8_0", "q5_0", "q4_k"), 8, 512, 256)]
)
def test_a_decode_step_lowers_to_the_router_and_the_packed_gemvs(formats, experts, d, f, monkeypatch):
    rows, top_k = 2, 4
    gate, up = (zero_stack(fmt, (experts, f, d)) for fmt in formats[:2])
    down = zero_stack(formats[2], (experts, d, f))
    monkeypatch.setattr(gpu, "triton_available", lambda: True)  # the op as traced for a GPU
    fn = lambda x, r, g, u, dn: gpu.moe(x, r, g, u, dn, top_k=top_k, normalize=True)  # noqa: E731
    calls = triton_calls(fn, jnp.zeros((rows, d), BF16), jnp.zeros((experts, d), BF16), gate, up, down)
    assert [c["name"] for c in calls] == ["moe_router_kernel", "moe_packed_gate_up_kernel", "moe_packed_down_kernel"]
    plans = launch_plans(rows, d, f, top_k, formats)
    for call, part in zip(calls[1:], ("gate_up", "down")):
        assert call["grid"] == tuple(plans[part]["grid"]) + (1,)


@pytest.mark.parametrize("formats", [("q4_k", "q4_k", "q6_k"), ("q8_0", "q5_0", "q4_k")])
def test_many_rows_lower_to_the_packed_grouped_gemm(formats, kernel_overrides, monkeypatch):
    experts, d, f, rows, top_k = 8, 512, 256, 64, 2
    gate, up = (zero_stack(fmt, (experts, f, d)) for fmt in formats[:2])
    down = zero_stack(formats[2], (experts, d, f))
    kernel_overrides({"moe.gemv_max_rows": 16})
    monkeypatch.setattr(gpu, "triton_available", lambda: True)
    monkeypatch.setattr(gpu, "dense_experts", lambda *a: pytest.fail("a packed stack dequantized"))
    fn = lambda x, r, g, u, dn: gpu.moe(x, r, g, u, dn, top_k=top_k, normalize=True)  # noqa: E731
    calls = triton_calls(fn, jnp.zeros((rows, d), BF16), jnp.zeros((experts, d), BF16), gate, up, down)
    assert [c["name"] for c in calls] == ["moe_packed_grouped_gate_up_kernel", "moe_packed_grouped_down_kernel"]
    strides = tuple(stack_args(w)[1] for w in (gate, up, down))
    plan = packed_grouped_plan(rows, d, f, experts, top_k, formats, "bfloat16", strides)
    for call, part in zip(calls, ("gate_up", "down")):
        assert call["grid"] == tuple(plan[part]["grid"]) + (1,)


def test_many_rows_without_the_grouped_gemm_dequantize_the_stacks(kernel_overrides, monkeypatch):
    experts, d, f, rows = 8, 512, 256, 64
    gate = zero_stack("q4_k", (experts, f, d))
    down = zero_stack("q6_k", (experts, d, f))
    kernel_overrides({"moe.gemv_max_rows": 16, "moe.grouped": False})
    monkeypatch.setattr(gpu, "triton_available", lambda: True)
    dequantized = []
    monkeypatch.setattr(gpu, "dense_experts", lambda w, dtype: dequantized.append(w) or dense_experts(w, dtype))
    fn = lambda x, r, g, dn: gpu.moe(x, r, g, g, dn, top_k=2, normalize=True)  # noqa: E731
    calls = triton_calls(fn, jnp.zeros((rows, d), BF16), jnp.zeros((experts, d), BF16), gate, down)
    assert calls == [] and len(dequantized) == 3  # the reference's ragged matmuls on the dequantized stacks
