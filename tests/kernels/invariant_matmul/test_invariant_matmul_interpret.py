"""The batch-invariant matmul kernel (compiler/kernels/invariant_matmul/kernel.py) in Triton's CPU interpreter:
its two forms (splits as programs + the fixed-order sum, splits walked in one program) give the same bits, a row
gives the same bits at every row count, and both match a float64 product to fp32 rounding."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.invariant_matmul.config import InvariantMatmulConfig, launch
from ember.compiler.kernels.invariant_matmul.kernel import invariant_matmul_kernel

pytestmark = pytest.mark.interpret

CONFIG = InvariantMatmulConfig(block_m=16, block_n=32, block_k=32, k_split=64)  # small tiles: the interpreter is slow


def _run(x, w, split_programs):
    rows, k = x.shape
    n = w.shape[0]
    plan = launch(CONFIG, rows, n, k, split_programs, ieee=x.dtype == np.float32)
    splits = CONFIG.splits(k)
    shape = (splits, rows, n) if split_programs else (rows, n)
    out = HostBuffer(np.full(shape, np.nan, np.float32 if split_programs else x.dtype))
    invariant_matmul_kernel[plan["grid"]](HostBuffer(x), HostBuffer(w), out, **plan["meta"])
    if not split_programs:
        return out.array
    total = out.array[0]
    for s in range(1, splits):
        total = total + out.array[s]
    return total.astype(x.dtype)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
def test_forms_and_row_counts_agree_bitwise(dtype):
    rng = np.random.default_rng(7)
    k, n = 200, 40  # K not a multiple of the split or the tile, N not a multiple of the tile
    x = rng.standard_normal((19, k)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)
    full = _run(x, w, split_programs=True)
    assert not np.isnan(full.astype(np.float32)).any()
    np.testing.assert_array_equal(_run(x, w, split_programs=False), full)
    for rows in (1, 2, 17):
        np.testing.assert_array_equal(_run(x[:rows], w, split_programs=rows < 10), full[:rows])
    want = x.astype(np.float64) @ w.astype(np.float64).T
    tol = 1e-5 if dtype == np.float32 else 1e-2
    err = np.abs(full.astype(np.float64) - want).max() / np.abs(want).max()
    assert err < tol, err
