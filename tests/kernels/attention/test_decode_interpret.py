"""The split-K decode attention kernels (compiler/kernels/attention/decode_kernel.py) in Triton's CPU interpreter
against the reference `_attend`: small ragged shapes, GQA 1/4/6/8, dh 64/80/128, blocks of 16/32, windows, splits
1..8 (single, or partials then the combine), fp32 and bf16; FP8 (e4m3) pools under bf16 q; more splits than one
combine tile holds. Sliding cases launch on trimmed tables whose dropped entries point at a NaN-filled block 0 the
kernel must never read. The fused kernels: test_decode_fused_interpret.py."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from decode_attention_cases import make_case, reference, rel_err, run_kernel

pytestmark = pytest.mark.interpret

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}

# (hq, hkv, dh): GQA groups 1, 4, 6, 8; a head size that is not a power of two (80: padded to 128 lanes)
HEADS = [(2, 2, 64), (4, 1, 128), (12, 2, 128), (8, 1, 64), (4, 2, 80)]
# (block_size, window): full attention, then sliding windows shorter than one block and spanning blocks
LAYOUTS = [(16, 0), (32, 0), (16, 5), (32, 37)]
# (splits, block_n): the single kernel at the default BLOCK_N (64), then partials + combine
SPLITS = [(1, None), (3, 16), (8, 32)]


@functools.cache
def cached_case(hq: int, hkv: int, dh: int, block_size: int, window: int, max_ctx: int = 100) -> dict:
    """One case per shape, shared by its dtypes and splits (full attention: with a padding row)."""
    rng = np.random.default_rng([hq, hkv, dh, block_size, window, max_ctx])
    return make_case(rng, hq, hkv, dh, block_size, window, max_ctx=max_ctx, padding_row=not window)


@functools.cache
def cached_reference(key: tuple, dtype_name: str, pool_dtype_name: str | None = None) -> np.ndarray:
    pool_dtype = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn}.get(pool_dtype_name)
    return reference(cached_case(*key), DTYPES[dtype_name], pool_dtype)


@pytest.mark.parametrize("splits, block_n", SPLITS, ids=[f"splits{s}-bn{n or 64}" for s, n in SPLITS])
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("block_size, window", LAYOUTS, ids=[f"bs{b}-window{w}" for b, w in LAYOUTS])
@pytest.mark.parametrize("hq, hkv, dh", HEADS, ids=[f"hq{a}-hkv{b}-dh{c}" for a, b, c in HEADS])
def test_decode_kernels_match_reference(hq, hkv, dh, block_size, window, dtype_name, splits, block_n):
    key = (hq, hkv, dh, block_size, window)
    expected = cached_reference(key, dtype_name)
    got = run_kernel(cached_case(*key), DTYPES[dtype_name], splits, block_n, nan_block0=bool(window))
    err = rel_err(got, expected)
    assert err < TOLERANCE[dtype_name], (
        f"rel_err={err:.1e} (tolerance {TOLERANCE[dtype_name]:.0e}){' on a NaN block 0' if window else ''}"
    )


@pytest.mark.parametrize("splits", [1, 3], ids=["splits1", "splits3"])
@pytest.mark.parametrize("hq, hkv, dh", [(12, 2, 128), (8, 1, 64)], ids=["hq12-hkv2-dh128", "hq8-hkv1-dh64"])
def test_fp8_pools_under_bf16_q(hq, hkv, dh, splits):
    """FP8 (e4m3) pools [blocks, 16, hkv, dh] under bf16 q: the fp16 dots, against the reference on the same
    rounded pools. 4e-3 is the bf16 output's rounding; the same rows on bf16 pools differ by 2-3e-2."""
    key = (hq, hkv, dh, 16, 0, 300)
    expected = cached_reference(key, "bfloat16", "float8_e4m3fn")
    got = run_kernel(cached_case(*key), ml_dtypes.bfloat16, splits, 32, pool_dtype=ml_dtypes.float8_e4m3fn)
    err = rel_err(got, expected)
    assert err < 4e-3, f"rel_err={err:.1e} (tolerance 4e-3)"


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_more_splits_than_one_combine_tile(dtype_name):
    """40 splits (one combine tile holds 32), long rows (context up to 1200) beside short ones; hq 12, hkv 2,
    dh 64, blocks of 16, BLOCK_N 16."""
    key = (12, 2, 64, 16, 0, 1200)
    expected = cached_reference(key, dtype_name)
    err = rel_err(run_kernel(cached_case(*key), DTYPES[dtype_name], 40, 16), expected)
    assert err < TOLERANCE[dtype_name], f"rel_err={err:.1e} (tolerance {TOLERANCE[dtype_name]:.0e})"
