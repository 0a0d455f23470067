"""Launch plans of the quantized GEMV's "rows" variant (compiler/kernels/gguf_gemv/matmul.py _rows_plan) and its config
rules, on CPU. The kernels themselves run in Triton's interpreter (test_quant_rows_interpret.py) and on the GPU
(test_quant_matmul_gpu.py)."""

from __future__ import annotations

import dataclasses

import pytest

from ember.compiler.kernels.gguf_gemv import FORMATS, QuantMatmulConfig, launch_plan, pick_config
from ember.compiler.kernels.gguf_gemv import config as config_module

SHAPES = [(256, 1536), (1792, 1536), (1536, 8960), (17920, 1536), (151936, 1536), (4096, 14336), (20, 1280)]


def rows(**kwargs) -> QuantMatmulConfig:
    return QuantMatmulConfig(variant="rows", **kwargs)


def units_of(fmt: str, inner: int) -> int:
    return inner // (32 if FORMATS[fmt][0] == 32 else 256)  # Q8_0 / Q5_0: a unit is one 32-element block


def check_cover(fmt: str, m: int, out: int, inner: int, config: QuantMatmulConfig) -> dict:
    """The plan tiles `out` and every unit of `in` exactly once, with no empty split."""
    plan = launch_plan(fmt, m, out, inner, config)
    meta = plan["meta"]
    grid_n, split_k, grid_z = plan["grid"]
    assert grid_z == 1 and split_k == plan["split_k"] >= 1
    assert meta["M"] == m and meta["N"] == out and meta["K"] == inner and meta["BLOCK_N"] == config.block_n
    assert grid_n * config.block_n >= out > (grid_n - 1) * config.block_n
    units, per_split, s = units_of(fmt, inner), meta["UNITS_PER_SPLIT"], meta["S"]
    assert (split_k - 1) * per_split < units <= split_k * per_split  # the last split owns >= 1 unit
    assert s & (s - 1) == 0 and 1 <= s
    steps = -(-per_split // s)
    if steps > 1:
        assert per_split % s == 0  # whole steps: only the last split's last step may be partly masked
    assert meta["PREFETCH"] == (config.prefetch and steps > 1)
    return plan


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block_n, split_k, sb", [(4, 1, 1), (8, 4, 2), (16, 8, 1), (64, 3, 4), (512, 100, 16)])
def test_rows_plans_cover_the_matrix(fmt, shape, block_n, split_k, sb) -> None:
    plan = check_cover(fmt, 1, *shape, rows(block_n=block_n, split_k=split_k, sb_per_step=sb))
    assert plan["split_k"] <= max(split_k, 1)


def test_rows_plan_examples() -> None:
    # 35 super-blocks, 8 splits, 2 per step: 5 per split round up to 6 (whole steps) -> 6 splits, the last of 5
    plan = launch_plan("q4_k", 1, 1536, 8960, rows(block_n=16, split_k=8, sb_per_step=2))
    assert plan["grid"] == (96, 6, 1) and plan["meta"]["UNITS_PER_SPLIT"] == 6 and plan["meta"]["S"] == 2
    # one super-block: split_k and S clamp to it, no prefetch
    plan = launch_plan("q6_k", 4, 20, 256, rows(block_n=8, split_k=4, sb_per_step=8))
    assert plan["grid"] == (3, 1, 1) and plan["meta"]["S"] == 1 and plan["meta"]["PREFETCH"] is False
    # Q8_0 steps are 8 blocks per sb_per_step; a split shorter than a step shrinks S to a power of two
    plan = launch_plan("q8_0", 2, 64, 1536, rows(block_n=4, split_k=8, sb_per_step=2))
    assert plan["meta"]["UNITS_PER_SPLIT"] == 6 and plan["meta"]["S"] == 8 and plan["grid"] == (16, 8, 1)
    plan = launch_plan("q8_0", 1, 64, 1536, rows(block_n=4, split_k=1, sb_per_step=2))
    assert plan["meta"]["S"] == 16 and plan["meta"]["UNITS_PER_SPLIT"] == 48 and plan["meta"]["PREFETCH"]


@pytest.mark.parametrize(
    "config, m, match",
    [
        (rows(block_n=2), 1, "block_n"),
        (rows(block_n=24), 1, "block_n"),
        (rows(block_n=1024), 1, "block_n"),
        (rows(sb_per_step=3), 1, "sb_per_step"),
        (rows(sb_per_step=32), 1, "sb_per_step"),
        (rows(sb_per_step=0), 1, "sb_per_step"),
        (rows(split_k=0), 1, "split_k"),
        (rows(), 5, "activation rows"),
        (rows(), 0, "activation rows"),
        (QuantMatmulConfig(variant="columns"), 1, "unknown kernel variant"),
    ],
)
def test_rows_plan_rejects_bad_configs(config, m, match) -> None:
    with pytest.raises(ValueError, match=match):
        launch_plan("q4_k", m, 64, 512, config)


def test_rows_plan_rejects_a_row_length_off_the_unit() -> None:
    with pytest.raises(ValueError, match="multiple"):
        launch_plan("q8_0", 1, 64, 48, rows())


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shape", SHAPES[:-1])
@pytest.mark.parametrize("m", [1, 2, 4, 5, 16])
def test_pick_config_rows_switch(fmt, shape, m, kernel_overrides) -> None:
    kernel_overrides({"quant_gemv.dp4a_formats": []})  # Q4_K's int8 path: tests/kernels/gguf_gemv/test_act_quant.py
    kernel_overrides({"quant_gemv.rows_for_decode": True})
    config = pick_config(fmt, m, *shape)
    assert config.variant == ("rows" if m <= 4 else "split")
    if m <= 4:
        check_cover(fmt, m, *shape, config)
    kernel_overrides({"quant_gemv.rows_for_decode": False})
    assert pick_config(fmt, m, *shape).variant == "split"


@pytest.mark.parametrize("key", sorted(config_module.MEASURED_M1))
def test_measured_configs_are_picked_and_cover_their_shape(key, kernel_overrides) -> None:
    fmt, out, inner = key
    kernel_overrides({"quant_gemv.dp4a_formats": []})
    kernel_overrides({"quant_gemv.rows_for_decode": True})
    config = pick_config(fmt, 1, out, inner)
    assert config is config_module.MEASURED_M1[key] and config.variant == "rows"
    check_cover(fmt, 1, out, inner, config)
    assert pick_config(fmt, 2, out, inner) is not config  # two rows: the register-sized rules
    kernel_overrides({"quant_gemv.rows_for_decode": False})
    assert pick_config(fmt, 1, out, inner).variant == "split"


@pytest.mark.parametrize("key", sorted(config_module.DP4A_M1))
def test_measured_dp4a_configs_are_picked_and_cover_their_shape(key, kernel_overrides) -> None:
    fmt, out, inner = key
    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    config = pick_config(fmt, 1, out, inner)
    assert config is config_module.DP4A_M1[key] and config.variant == "dp4a"
    check_cover(fmt, 1, out, inner, dataclasses.replace(config, variant="rows"))  # the same frame along out/in
