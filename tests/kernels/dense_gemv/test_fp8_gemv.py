"""The FP8 decode GEMV (compiler/kernels/dense_gemv/kernel.py) on this CPU: its config table and launch plans, the
dispatch in fp8_linear, and its lowering to XLA's native Triton custom call for the cuda platform (the numerics
run in Triton's interpreter: tests/kernels/dense_gemv/test_fp8_gemv_interpret.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from triton_calls import triton_calls

from ember.compiler.kernels.dense_gemv import fp8 as fp8_module
from ember.compiler.kernels.dense_gemv.config import FP8_RULES, Fp8GemvConfig, launch_plan, pick_fp8_config
from ember.compiler.kernels.dense_gemv.fp8 import GEMV_MAX_ROWS, fp8_linear, quantize_fp8, use_fp8_gemv
from ember.compiler.kernels.dense_gemv.kernel import fp8_gemv

SHAPES_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("out, inner", SHAPES_8B)
@pytest.mark.parametrize("blocked", [False, True])
def test_every_decode_shape_gets_a_valid_plan_with_enough_programs(m, out, inner, blocked):
    config = pick_fp8_config(m, out, inner, blocked=blocked)
    plan = launch_plan(m, out, inner, config, blocked=blocked)
    grid = plan["grid"]
    assert grid == (-(-out // config.block_n), plan["split_k"], 1)
    assert grid[0] * grid[1] >= 2 * 132  # at least two programs per SM of an H200
    meta = plan["meta"]
    assert meta["K_PER_SPLIT"] % meta["BLOCK_K"] == 0 and plan["split_k"] * meta["K_PER_SPLIT"] >= inner
    assert (plan["split_k"] - 1) * meta["K_PER_SPLIT"] < inner  # no empty split
    assert meta["BLOCK_M"] >= m and (meta["BLOCK_M"] == 16 if config.use_dot else meta["BLOCK_M"] < 2 * m)


def test_split_k_is_clamped_so_that_no_split_is_empty():
    plan = launch_plan(1, 100, 300, Fp8GemvConfig(block_n=32, block_k=64, split_k=16), blocked=False)
    assert plan["split_k"] == 5 and plan["meta"]["K_PER_SPLIT"] == 64  # 5 steps of 64 columns
    plan = launch_plan(1, 100, 1024, Fp8GemvConfig(block_k=128, split_k=3), blocked=False)
    assert plan["split_k"] == 3 and plan["meta"]["K_PER_SPLIT"] == 384  # 3 + 3 + 2 steps
    plan = launch_plan(1, 100, 1024, Fp8GemvConfig(block_k=256, split_k=4), blocked=False)
    assert not plan["meta"]["PREFETCH"]  # one step per split: nothing to prefetch


def test_block_scales_take_128_wide_dot_sub_tiles():
    dot = Fp8GemvConfig(block_n=32, block_k=512, use_dot=True)
    assert launch_plan(16, 256, 1024, dot, blocked=True)["meta"]["KS"] == 128
    assert launch_plan(16, 256, 1024, dot, blocked=False)["meta"]["KS"] == 512
    assert launch_plan(1, 256, 1024, Fp8GemvConfig(block_k=64), blocked=True)["meta"]["KS"] == 64


@pytest.mark.parametrize(
    "kwargs, m, match",
    [
        (dict(block_n=24), 1, "block_n"),
        (dict(block_n=512), 1, "block_n"),
        (dict(block_k=8), 1, "block_k"),
        (dict(block_k=96), 1, "block_k"),
        (dict(block_n=8, use_dot=True), 4, "use_dot"),
        (dict(split_k=0), 1, "split_k"),
        (dict(), 0, "activation rows"),
        (dict(), GEMV_MAX_ROWS + 1, "activation rows"),
    ],
)
def test_bad_configs_and_row_counts_are_refused(kwargs, m, match):
    with pytest.raises(ValueError, match=match):
        launch_plan(m, 256, 512, Fp8GemvConfig(**kwargs), blocked=False)


def test_block_scales_need_row_tiles_inside_one_scale_block_and_int32_offsets():
    with pytest.raises(ValueError, match="block scales"):
        launch_plan(1, 512, 512, Fp8GemvConfig(block_n=256), blocked=True)
    with pytest.raises(ValueError, match="int32"):
        launch_plan(1, 1 << 16, 1 << 15, Fp8GemvConfig(), blocked=False)


def test_the_rules_are_ordered_and_end_in_a_catch_all():
    assert FP8_RULES[-1].max_out > 1 << 40 and FP8_RULES[-1].max_m == GEMV_MAX_ROWS
    for rule in FP8_RULES:
        assert launch_plan(min(rule.max_m, GEMV_MAX_ROWS), 1024, 4096, rule.config, blocked=True)


@pytest.mark.parametrize(
    "m, out, inner, blocked",
    [(1, 6144, 4096, False), (1, 4096, 14336, True), (8, 1024, 4096, True), (16, 28672, 4096, False)],
)
def test_the_gemv_lowers_to_one_native_kernel(m, out, inner, blocked):
    w = quantize_fp8(jnp.zeros((out, inner), jnp.float32), blocked=blocked)
    x = jnp.zeros((m, inner), jnp.bfloat16)
    calls = triton_calls(fp8_gemv, x, w)
    config = pick_fp8_config(m, out, inner, blocked=blocked)
    assert [c["name"] for c in calls] == ["fp8_gemv_kernel"]
    assert calls[0]["grid"] == launch_plan(m, out, inner, config, blocked=blocked)["grid"]
    assert (calls[0]["num_warps"], calls[0]["num_stages"]) == (config.num_warps, config.num_stages)


def test_fp8_linear_takes_the_gemv_only_for_few_rows_on_a_gpu(monkeypatch, kernel_overrides):
    w = quantize_fp8(np.ones((256, 512), np.float32))
    small, large = jnp.zeros((1, 512), jnp.bfloat16), jnp.zeros((GEMV_MAX_ROWS + 1, 512), jnp.bfloat16)
    assert not use_fp8_gemv(small, w)  # this CPU: the XLA path
    monkeypatch.setattr(fp8_module, "triton_available", lambda: True)  # as if traced for a GPU
    assert use_fp8_gemv(small, w) and not use_fp8_gemv(large, w)
    assert not use_fp8_gemv(jnp.zeros((4, 512), jnp.bfloat16), w)  # by default only where it measured faster
    kernel_overrides({"fp8_gemv.max_rows": GEMV_MAX_ROWS})
    assert use_fp8_gemv(jnp.zeros((4, 512), jnp.bfloat16), w)
    assert [c["name"] for c in triton_calls(fp8_linear, small, w)] == ["fp8_gemv_kernel"]
    assert triton_calls(fp8_linear, large, w) == []
    kernel_overrides({"fp8_gemv.enabled": False})
    assert not use_fp8_gemv(small, w)


def test_packed_projections_and_the_gated_input_lower_to_one_kernel_each(monkeypatch, kernel_overrides):
    monkeypatch.setattr(fp8_module, "triton_available", lambda: True)  # as if traced for a GPU
    qkv = quantize_fp8(jnp.zeros((6144, 4096), jnp.float32))
    x = jnp.zeros((1, 4096), jnp.bfloat16)
    calls = triton_calls(lambda x: fp8_module.fp8_linear_parts(x, qkv, (4096, 1024, 1024)), x)
    assert [c["name"] for c in calls] == ["fp8_gemv_parts_kernel"]  # three outputs, no slices after it
    gate_up = quantize_fp8(jnp.zeros((2 * 14336, 4096), jnp.float32))
    gated = lambda x: fp8_module.fp8_linear_gate_up_silu(x, gate_up)  # noqa: E731
    assert [c["name"] for c in triton_calls(gated, x)] == ["fp8_gemv_kernel"]

    def lowered():  # a fresh function each time: jit would reuse the trace made under other settings
        return jax.jit(lambda x: gated(x)).trace(x).lower(lowering_platforms=("cuda",)).as_text()

    kernel_overrides({"fp8_gemv.config": {"split_k": 2}})  # no epilogue: the jnp activation runs after it
    assert "multiply" in lowered()
    kernel_overrides({"fp8_gemv.config": {}})
    assert "multiply" not in lowered()  # silu(gate) * up made in the kernel's epilogue


def test_parts_fit_only_whole_row_tiles_of_three_projections():
    from ember.compiler.kernels.dense_gemv.kernel import parts_fit

    w = quantize_fp8(np.zeros((6144, 4096), np.float32))
    words = Fp8GemvConfig(block_n=8, block_k=1024, words=True)
    assert parts_fit(1, w, (4096, 1024, 1024), words)
    assert not parts_fit(1, w, (4092, 1028, 1024), words)  # a boundary inside a row tile
    assert not parts_fit(1, w, (4096, 2048), words)  # two projections: slices
    assert not parts_fit(1, w, (4096, 1024, 1024), Fp8GemvConfig(block_k=512, split_k=2))  # K splits


def test_the_fused_forms_match_the_unfused_path_on_this_cpu():
    rng = np.random.default_rng(0)
    w = quantize_fp8(rng.standard_normal((96, 64)).astype(np.float32))  # q/k/v 32 each, or gate/up 48 each
    x = jnp.asarray(rng.standard_normal((2, 64)), jnp.bfloat16)
    parts = fp8_module.fp8_linear_parts(x, w, (32, 32, 32))
    whole = np.asarray(fp8_module.fp8_linear_xla(x, w), np.float32)
    np.testing.assert_array_equal(np.concatenate([np.asarray(p, np.float32) for p in parts], axis=1), whole)
    from ember.compiler.kernels.activation import gated_act_packed

    np.testing.assert_array_equal(
        np.asarray(fp8_module.fp8_linear_gate_up_silu(x, w), np.float32),
        np.asarray(gated_act_packed(fp8_linear(x, w), act="silu"), np.float32),
    )


def test_the_gate_up_epilogue_and_the_word_loop_refuse_what_they_cannot_do():
    for kwargs, blocked, out in (
        (dict(), True, 256),
        (dict(split_k=2), False, 256),
        (dict(block_n=1), False, 256),
        (dict(), False, 255),
    ):
        with pytest.raises(ValueError, match="gate/up epilogue"):
            launch_plan(1, out, 512, Fp8GemvConfig(**kwargs), blocked=blocked, gate_up=True)
    plan = launch_plan(1, 256, 512, Fp8GemvConfig(block_n=8), blocked=False, gate_up=True)
    assert plan["grid"][:2] == (32, 1) and plan["meta"]["GATE_UP"]  # 4 gate + 4 up rows per program
    with pytest.raises(ValueError, match="in % 4"):
        launch_plan(1, 256, 510, Fp8GemvConfig(words=True), blocked=False)
    assert not pick_fp8_config(1, 256, 510).words and pick_fp8_config(1, 256, 512).words
