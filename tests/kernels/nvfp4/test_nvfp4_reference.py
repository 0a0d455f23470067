"""The NVFP4 format's jnp reference (compiler/kernels/nvfp4/reference.py) against an independent numpy decoding
through ml_dtypes' float4_e2m1fn / float8_e4m3fn, the quantizer's round trip, and the launch plans."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from ember.compiler.kernels.nvfp4 import (
    Nvfp4Config,
    Nvfp4Weight,
    dequantize_nvfp4,
    nvfp4_matmul,
    nvfp4_plan,
    quantize_nvfp4,
)


def random_weight(rng, out: int, inner: int) -> Nvfp4Weight:
    """Every code and every finite E4M3 scale pattern is fair (NaN patterns 0x7F / 0xFF left out)."""
    packed = rng.integers(0, 256, (out, inner // 2), dtype=np.uint8)
    scales = rng.integers(0, 256, (out, inner // 16), dtype=np.uint8)
    scales = np.where((scales & 0x7F) == 0x7F, scales ^ 1, scales).astype(np.uint8)
    return Nvfp4Weight(packed, scales, rng.uniform(0.5, 2.0, out).astype(np.float32))


def numpy_dequantize(w: Nvfp4Weight) -> np.ndarray:
    out, inner = w.shape
    codes = np.empty((out, inner), np.uint8)
    codes[:, 0::2], codes[:, 1::2] = w.packed & 15, w.packed >> 4  # even element in the low nibble
    values = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    scales = np.asarray(w.scales).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return values * np.repeat(scales, 16, axis=1) * w.row_scale[:, None]


def test_reference_decodes_every_code_and_scale_as_ml_dtypes_does():
    w = random_weight(np.random.default_rng(0), 24, 512)
    np.testing.assert_array_equal(np.asarray(dequantize_nvfp4(w)), numpy_dequantize(w))


def test_quantizer_round_trip_is_within_the_format_error():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((32, 256)).astype(np.float32) * 0.05
    packed, scales, global_scale = quantize_nvfp4(weight)
    w = Nvfp4Weight(packed, scales.view(np.uint8), np.full(32, global_scale, np.float32))
    back = np.asarray(dequantize_nvfp4(w))
    # E2M1 steps are at most 1/3 of a group's largest value (4 -> 6 of 6): half a step of error, plus E4M3
    group_max = np.repeat(np.abs(weight.reshape(32, 16, 16)).max(-1), 16, axis=1)
    assert np.all(np.abs(back - weight) <= group_max * (1 / 6 + 1 / 16) + 1e-9)
    assert np.corrcoef(back.ravel(), weight.ravel())[0, 1] > 0.99


def test_matmul_reference_backend_is_x_times_the_dequantized_weight():
    rng = np.random.default_rng(2)
    w = random_weight(rng, 16, 64)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    got = np.asarray(nvfp4_matmul(jnp.asarray(x), w))
    np.testing.assert_allclose(got, x @ numpy_dequantize(w).T, rtol=1e-5, atol=1e-5 * np.abs(got).max())


@pytest.mark.parametrize("inner, block_k", [(4096, 128), (96, 32), (640, 128)])
def test_plan_k_tile_divides_the_row(inner, block_k):
    plan = nvfp4_plan(5, 100, inner, Nvfp4Config(block_k=128, block_n=64))
    assert plan["meta"]["BLOCK_K"] == block_k and plan["grid"] == (2, 1, 1)


def test_plan_refuses_rows_that_are_not_whole_groups():
    with pytest.raises(ValueError, match="multiple of 32"):
        nvfp4_plan(1, 64, 48, Nvfp4Config())
