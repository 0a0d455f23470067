"""The dense decode GEMV (compiler/kernels/dense_gemv/dispatch.py) on this CPU: which projections of plain weights take it
when a plan is traced for a GPU, the kernels they lower to, and that everything else keeps XLA's GEMM. The
numerics run in Triton's interpreter (tests/kernels/dense_gemv/test_fp8_gemv_interpret.py: DENSE_CASES) and on the H200
(tests/kernels/dense_gemv/test_dense_gemv_gpu.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from triton_calls import triton_calls

from ember.compiler.kernels.dense_gemv import dispatch as dense_module
from ember.compiler.kernels.dense_gemv.config import launch_plan
from ember.compiler.kernels.dense_gemv.dispatch import pick_dense_config, use_dense_gemv
from ember.compiler.kernels.gguf_gemv import linear as linear_quant

BF16 = jnp.bfloat16


@pytest.fixture
def gpu_trace(monkeypatch):
    monkeypatch.setattr(dense_module, "triton_available", lambda: True)  # as if traced for a GPU


def names(calls) -> list[str]:
    return [c["name"] for c in calls]


def test_off_the_gpu_plain_weights_keep_the_reference_gemm():
    x, w = jnp.zeros((1, 64), BF16), jnp.zeros((32, 64), BF16)
    assert not use_dense_gemv(x, w)
    assert triton_calls(lambda x, w: linear_quant.linear(x, w), x, w) == []


def test_one_row_takes_one_kernel_with_the_picked_plan(gpu_trace):
    x, w = jnp.zeros((1, 4096), BF16), jnp.zeros((4096, 4096), BF16)
    calls = triton_calls(lambda x, w: linear_quant.linear(x, w), x, w)
    config = pick_dense_config(1, 4096, 4096)
    assert names(calls) == ["fp8_gemv_kernel"]
    assert calls[0]["grid"] == launch_plan(1, 4096, 4096, config, blocked=False)["grid"]
    assert calls[0]["num_warps"] == config.num_warps
    y = jax.eval_shape(lambda x, w: linear_quant.linear(x, w), x, w)
    assert (y.shape, y.dtype) == ((1, 4096), BF16)


def test_more_rows_other_dtypes_and_the_off_switch_keep_xla(gpu_trace, kernel_overrides):
    w = jnp.zeros((4096, 4096), BF16)
    assert use_dense_gemv(jnp.zeros((1, 4096), BF16), w)
    assert not use_dense_gemv(jnp.zeros((2, 4096), BF16), w)  # by default only one row
    assert not use_dense_gemv(jnp.zeros((1, 4096), jnp.int32), w)
    assert not use_dense_gemv(jnp.zeros((1, 4096), BF16), jnp.zeros((4096, 4096), jnp.int8))
    assert triton_calls(lambda x, w: linear_quant.linear(x, w), jnp.zeros((8, 4096), BF16), w) == []
    kernel_overrides({"dense_gemv.enabled": False})
    assert not use_dense_gemv(jnp.zeros((1, 4096), BF16), w)


def test_packed_qkv_writes_three_outputs_from_one_launch(gpu_trace):
    x, w = jnp.zeros((1, 4096), BF16), jnp.zeros((6144, 4096), BF16)
    split = lambda x, w: linear_quant.linear_split(x, w, sizes=(4096, 1024, 1024))  # noqa: E731
    assert names(triton_calls(split, x, w)) == ["fp8_gemv_parts_kernel"]  # no split kernel after it
    assert [o.shape for o in jax.eval_shape(split, x, w)] == [(1, 4096), (1, 1024), (1, 1024)]
    text = jax.jit(split).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert "slice" not in text and "dot_general" not in text


def test_with_a_bias_the_packed_projection_keeps_the_gemm():
    x, w, b = jnp.zeros((1, 64), BF16), jnp.zeros((96, 64), BF16), jnp.zeros((96,), BF16)
    outs = jax.eval_shape(lambda x, w, b: linear_quant.linear_split(x, w, b, sizes=(32, 32, 32)), x, w, b)
    assert [o.shape for o in outs] == [(1, 32)] * 3


def test_gated_mlp_makes_the_activation_in_the_gate_up_epilogue(gpu_trace):
    x = jnp.zeros((1, 4096), BF16)
    gate_up, down = jnp.zeros((2 * 14336, 4096), BF16), jnp.zeros((4096, 14336), BF16)
    mlp = lambda x, g, d: linear_quant.gated_mlp(x, g, d, act="silu")  # noqa: E731
    calls = triton_calls(mlp, x, gate_up, down)
    assert names(calls) == ["fp8_gemv_kernel"]  # gate/up with its epilogue; the down projection stays XLA's
    assert calls[0]["grid"][0] == 2 * 14336 // pick_dense_config(1, 2 * 14336, 4096).block_n
    text = jax.jit(mlp).trace(x, gate_up, down).lower(lowering_platforms=("cuda",)).as_text()
    assert "logistic" not in text and "multiply" not in text  # no jnp activation between the two kernels
    assert text.count("dot_general") == 1  # the down projection's GEMM
    assert jax.eval_shape(mlp, x, gate_up, down).shape == (1, 4096)


@pytest.mark.parametrize(
    "out, inner, kernel",
    [
        (128256, 4096, True),
        (2 * 14336, 4096, True),
        (6144, 4096, True),
        (4096, 4096, True),
        (4096, 14336, False),
        (1536, 1536, False),
        (2 * 8960, 1536, False),
        (1536, 8960, False),
    ],
)
def test_the_table_takes_the_measured_shapes_only(out, inner, kernel):
    # the 8B shapes where the kernel measured faster than XLA's GEMM and what follows it; the 8B down
    # projection (slower) and unmeasured shapes (the 1.5B's) keep XLA
    assert (pick_dense_config(1, out, inner) is not None) is kernel


def test_the_config_override_is_read_at_trace_time(kernel_overrides):
    assert pick_dense_config(1, 4096, 14336) is None
    kernel_overrides({"dense_gemv.config": {"block_n": 8, "block_k": 1024, "num_warps": 8}})
    config = pick_dense_config(1, 4096, 4096)
    assert (config.block_n, config.block_k, config.num_warps, config.words) == (8, 1024, 8, False)
    assert pick_dense_config(1, 4096, 14336).block_n == 8  # an override also reaches the shapes XLA keeps
    kernel_overrides({"dense_gemv.config": {"tile": 3}})
    with pytest.raises(ValueError, match="dense_gemv.config"):
        pick_dense_config(1, 4096, 4096)


def test_a_row_bound_keeps_the_largest_weights_on_xla(gpu_trace, kernel_overrides):
    x = jnp.zeros((1, 4096), BF16)
    kernel_overrides({"dense_gemv.max_out": 6144})
    assert use_dense_gemv(x, jnp.zeros((4096, 4096), BF16)) and not use_dense_gemv(x, jnp.zeros((6144, 4096), BF16))
