"""The quantized GEMV's "rows" variant (compiler/kernels/gguf_gemv/rows_*.py, float activations, m <= 4) run by
Triton's CPU interpreter against the jnp reference (quant_matmul_ref), for every format. Its launch plans alone:
test_quant_rows_plan.py."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig, launch_plan, pack, quant_matmul_ref, random_gguf_bytes

pytestmark = pytest.mark.interpret

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# (out, in), (block_n, split_k, sb_per_step, prefetch), [(m, dtype), ...]. Together they cover m = 1..4 in
# both dtypes, split_k 1 and > 1 (the last split shorter), masked row tiles (out not a multiple of block_n),
# a last step only partly inside the range (S not dividing the split's units), block_n down to 4, PREFETCH
# off, and one super-block (split_k and S clamped).
ROWS_CASES = [
    ((40, 1536), (16, 1, 4, True), [(1, "float32"), (4, "bfloat16")]),
    ((40, 1536), (8, 4, 1, True), [(2, "float32"), (3, "bfloat16")]),
    ((20, 1280), (4, 2, 2, True), [(1, "bfloat16"), (4, "float32")]),
    ((24, 1280), (16, 1, 2, False), [(3, "float32")]),
    ((12, 256), (8, 3, 2, True), [(2, "bfloat16")]),
    ((44, 2048), (16, 2, 2, True), [(1, "bfloat16"), (2, "float32")]),  # Q4_K EXACT: 2 splits of 2 steps
]
CASES = [
    pytest.param(
        fmt, shape, tiling, m, dtype, id=f"{fmt}-{shape[0]}x{shape[1]}-bn{tiling[0]}-split{tiling[1]}-m{m}-{dtype}"
    )
    for fmt in ("q4_k", "q6_k", "q8_0", "q5_0")
    for shape, tiling, runs in ROWS_CASES
    for m, dtype in runs
]


@functools.cache
def weight(fmt: str, shape: tuple[int, int]):
    """A packed [out, in] weight of realistic GGUF blocks."""
    return pack(random_gguf_bytes(np.random.default_rng(1), fmt, shape, realistic=True), fmt, shape)


@pytest.mark.parametrize("fmt, shape, tiling, m, dtype", CASES)
def test_rows_kernel_matches_the_reference(fmt, shape, tiling, m, dtype):
    from ember.compiler.kernels.gguf_gemv.rows_kernel import ROWS_KERNELS

    kernel, names = ROWS_KERNELS[fmt]
    (out, inner), (block_n, split_k, sb, prefetch) = shape, tiling
    w = weight(fmt, shape)
    x = np.random.default_rng(m).standard_normal((m, inner)).astype(DTYPES[dtype])
    expected = np.asarray(quant_matmul_ref(jnp.asarray(x).astype(jnp.float32), w))
    config = QuantMatmulConfig(variant="rows", block_n=block_n, split_k=split_k, sb_per_step=sb, prefetch=prefetch)
    plan = launch_plan(fmt, m, out, inner, config)
    splits, meta = plan["split_k"], plan["meta"]
    # y [split_k, m, out], NaN where no program writes: the activations' dtype for one split, else float32
    y = HostBuffer(np.full((splits, m, out), np.nan, DTYPES[dtype] if splits == 1 else np.float32))
    kernel[plan["grid"]](HostBuffer(x), *(HostBuffer(w.planes[n]) for n in names), y, **meta)
    got = y.array.astype(np.float32).sum(axis=0)
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    tol = 1e-4 if dtype == "float32" else 1e-2
    assert err < tol, (  # NaN (an unwritten row or split) fails too
        f"rows {fmt} {out}x{inner} m={m} {dtype} block_n={block_n} grid={plan['grid'][:2]} S={meta['S']} "
        f"units/split={meta['UNITS_PER_SPLIT']} prefetch={meta['PREFETCH']} exact={meta.get('EXACT', '-')}: "
        f"rel_err={err:.1e} (tolerance {tol})"
    )
