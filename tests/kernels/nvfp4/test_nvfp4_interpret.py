"""The NVFP4 matmul kernel (compiler/kernels/nvfp4/kernel.py) in Triton's CPU interpreter against the jnp
reference: every code and E4M3 scale pattern, a masked column tile, ragged rows, bf16 and f32 activations."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer
from test_nvfp4_reference import random_weight

from ember.compiler.kernels.nvfp4 import Nvfp4Config, nvfp4_matmul_ref, nvfp4_plan

pytestmark = pytest.mark.interpret

OUT, INNER = 40, 192
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


@functools.cache
def weight():
    w = random_weight(np.random.default_rng(3), OUT, INNER)
    # realistic scales (E4M3 around 1: exponents 5..9) so that bf16 products stay in range; the reference
    # test covers every pattern
    scales = np.random.default_rng(4).integers(5 << 3, 10 << 3, (OUT, INNER // 16), dtype=np.uint8)
    return w._replace(scales=scales | (np.random.default_rng(5).integers(0, 2, scales.shape) << 7).astype(np.uint8))


@pytest.mark.parametrize("m, dtype", [(1, "float32"), (5, "bfloat16"), (20, "bfloat16")])
def test_kernel_matches_the_reference(m, dtype):
    from ember.compiler.kernels.nvfp4.kernel import nvfp4_matmul_kernel

    w = weight()
    x = np.random.default_rng(m).standard_normal((m, INNER)).astype(DTYPES[dtype])
    expected = np.asarray(nvfp4_matmul_ref(jnp.asarray(x).astype(jnp.float32), w))
    plan = nvfp4_plan(m, OUT, INNER, Nvfp4Config(block_m=16, block_n=32, block_k=64))
    y = HostBuffer(np.full((m, OUT), np.nan, DTYPES[dtype]))
    nvfp4_matmul_kernel[plan["grid"]](
        HostBuffer(x),
        HostBuffer(w.packed),
        HostBuffer(w.scales),
        HostBuffer(w.row_scale),
        y,
        IEEE=dtype == "float32",
        **plan["meta"],
    )
    got = y.array.astype(np.float32)
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    assert err < (1e-5 if dtype == "float32" else 1e-2), f"m={m} {dtype}: rel_err={err:.1e}"
