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
    invariant_matmul_kernel[plan["grid"]](HostBuffer(x), *[HostBuffer(w)] * 4, out, **plan["meta"])
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


PACKED_CONFIG = InvariantMatmulConfig(block_m=16, block_n=32, block_k=64, k_split=256)


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q8_0", "q5_0"])
def test_packed_weights_give_the_dense_copys_bits(fmt):
    """The kernel decoding a GGUF weight's packed planes gives the bits of the same kernel over its dense copy (the
    load-time dequantization, rounded to bf16), at every row count and in both forms."""
    import jax.numpy as jnp

    from ember.compiler.kernels.gguf_gemm.gemm import plane_args
    from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
    from ember.compiler.kernels.gguf_gemv.reference import dequantize

    n, k = 40, 512  # two splits of 256; the second 32-column tile half past N
    w = pack(random_gguf_bytes(np.random.default_rng(3), fmt, (n, k), realistic=True), fmt, (n, k))
    dense = np.asarray(dequantize(w).astype(jnp.bfloat16))
    x = np.random.default_rng(4).standard_normal((19, k)).astype(ml_dtypes.bfloat16)
    planes = [HostBuffer(np.asarray(p)) for p in plane_args(w)]

    def run(rows, split_programs, packed):
        plan = launch(PACKED_CONFIG, rows, n, k, split_programs, ieee=False, fmt=fmt if packed else "dense")
        shape = (PACKED_CONFIG.splits(k), rows, n) if split_programs else (rows, n)
        out = HostBuffer(np.full(shape, np.nan, np.float32 if split_programs else x.dtype))
        weights = planes if packed else [HostBuffer(dense)] * 4
        invariant_matmul_kernel[plan["grid"]](HostBuffer(x[:rows]), *weights, out, **plan["meta"])
        if not split_programs:
            return out.array
        return (out.array[0] + out.array[1]).astype(x.dtype)

    whole = run(19, False, packed=False)
    assert not np.isnan(whole.astype(np.float32)).any()
    for rows, split_programs in ((19, False), (19, True), (1, True), (17, False)):
        np.testing.assert_array_equal(run(rows, split_programs, packed=True), whole[:rows], err_msg=f"{rows}")
