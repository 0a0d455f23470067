"""The quantized GEMM's launch plans and config picks (pure Python: no Triton needed)."""

from __future__ import annotations

import pytest

from ember.compiler.kernels.gguf_gemm import CONFIGS, GemmConfig, gemm_plan, pick_gemm_config


def test_plan_covers_every_output_tile_once():
    plan = gemm_plan("q4_k", 300, 1000, 4096, GemmConfig(block_m=64, block_n=128, sub=4))
    assert plan["grid"] == (5 * 8, 1, 1)  # cdiv(300, 64) row tiles x cdiv(1000, 128) column tiles
    assert plan["meta"]["SUB"] == 4 and plan["meta"]["FMT"] == "q4_k"


@pytest.mark.parametrize("inner, sub", [(4096, 8), (640, 4), (480, 1), (96, 1)])
def test_k_tile_shrinks_to_a_divisor_of_the_row(inner, sub):
    assert gemm_plan("q8_0", 32, 64, inner, GemmConfig(sub=8))["meta"]["SUB"] == sub


@pytest.mark.parametrize(
    "fmt, inner, config, message",
    [
        ("q4_k", 300, GemmConfig(), "multiple of 256"),
        ("q4_0", 256, GemmConfig(), "no q4_0 kernel"),
        ("q8_0", 64, GemmConfig(block_m=8), ">= 16"),
        ("q8_0", 64, GemmConfig(block_n=48), "power of two"),
    ],
)
def test_plan_refuses_what_the_kernel_cannot_run(fmt, inner, config, message):
    with pytest.raises(ValueError, match=message):
        gemm_plan(fmt, 16, 64, inner, config)


def test_config_grows_with_the_rows_and_takes_overrides():
    bounds = [bound for bound, _ in CONFIGS]
    assert bounds == sorted(bounds)
    assert pick_gemm_config(3).block_m <= pick_gemm_config(4096).block_m
    assert pick_gemm_config(4096, (("block_n", 64), ("num_stages", 4))) == GemmConfig(
        block_m=CONFIGS[-1][1].block_m,
        block_n=64,
        sub=CONFIGS[-1][1].sub,
        num_warps=CONFIGS[-1][1].num_warps,
        num_stages=4,
    )
