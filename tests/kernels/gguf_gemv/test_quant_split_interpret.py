"""The quantized GEMV's "split" variant (compiler/kernels/gguf_gemv/split_kernel.py) run by Triton's CPU
interpreter against the jnp reference (quant_matmul_ref), for every format: 48 x 1024 weights (the last row
tile of 32 half masked), m = 1..40 activation rows in float32 and bfloat16, split_k 1 and 3."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig, launch_plan, pack, quant_matmul_ref, random_gguf_bytes

pytestmark = pytest.mark.interpret

OUT, INNER = 48, 1024
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
# the whole row tile per program, and 3 splits of K (float32 partial sums, added here) over steps of 4 blocks
CONFIGS = {
    "bn16": QuantMatmulConfig(block_n=16),
    "bn32-split3": QuantMatmulConfig(block_n=32, split_k=3, blocks_per_step=4),
}
CASES = [
    pytest.param(fmt, m, dtype, config, id=f"{fmt}-m{m}-{dtype}-{config}")
    for fmt in ("q4_k", "q6_k", "q8_0", "q5_0")
    for m in (1, 3, 16, 17, 40)
    for dtype in DTYPES
    for config in CONFIGS
]


@functools.cache
def weight(fmt: str):
    """A packed [48, 1024] weight of realistic GGUF blocks, one per format."""
    return pack(random_gguf_bytes(np.random.default_rng(0), fmt, (OUT, INNER), realistic=True), fmt, (OUT, INNER))


@functools.cache
def activations(fmt: str, m: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """x [m, 1024] in `dtype` and the reference's product [m, 48] in float32 (shared by both configs)."""
    x = np.random.default_rng(m).standard_normal((m, INNER)).astype(DTYPES[dtype])
    return x, np.asarray(quant_matmul_ref(jnp.asarray(x).astype(jnp.float32), weight(fmt)))


@pytest.mark.parametrize("fmt, m, dtype, config_name", CASES)
def test_split_kernel_matches_the_reference(fmt, m, dtype, config_name):
    from ember.compiler.kernels.gguf_gemv.split_kernel import KERNELS

    kernel, names = KERNELS[fmt]
    w = weight(fmt)
    x, expected = activations(fmt, m, dtype)
    plan = launch_plan(fmt, m, OUT, INNER, CONFIGS[config_name])
    splits = plan["split_k"]
    # y [split_k, m, 48]: the activations' dtype when one split writes it, else float32 partial sums
    y = HostBuffer(np.zeros((splits, m, OUT), DTYPES[dtype] if splits == 1 else np.float32))
    kernel[plan["grid"]](
        HostBuffer(x), *(HostBuffer(w.planes[n]) for n in names), y, IEEE=dtype == "float32", **plan["meta"]
    )
    got = y.array.astype(np.float32).sum(axis=0)
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    tol = 1e-4 if dtype == "float32" else 1e-2
    assert err < tol, (
        f"{fmt} m={m} {dtype} block_n={plan['meta']['BLOCK_N']} split_k={splits}: rel_err={err:.1e} (tolerance {tol})"
    )
