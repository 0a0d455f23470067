"""The quantized GEMM (compiler/kernels/gguf_gemm/kernel.py) run by Triton's CPU interpreter against the jnp
reference (quant_matmul_ref), for every format: 48 outputs (the second 32-row tile half masked), ragged row
counts (3, 17, 40 over 16-row tiles), bf16 and f32 activations, K tiles of 1 to 8 groups of 32."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.gguf_gemm import GemmConfig, gemm_plan
from ember.compiler.kernels.gguf_gemm.gemm import plane_args
from ember.compiler.kernels.gguf_gemv import pack, quant_matmul_ref, random_gguf_bytes

pytestmark = pytest.mark.interpret

OUT = 48
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
INNER = {"q4_k": 512, "q6_k": 512, "q8_0": 480, "q5_0": 480}  # 480: 15 blocks of 32, the K tile shrinks to one
CONFIGS = {
    "sub4": GemmConfig(block_m=16, block_n=32, sub=4, group_m=2),
    "sub8-bm32": GemmConfig(block_m=32, block_n=16, sub=8, group_m=1),
}
CASES = [  # the 17-row case repeats the others' coverage at the interpreter's cost: kept out of CI (`slow`)
    pytest.param(fmt, m, dtype, config, id=f"{fmt}-m{m}-{dtype}-{config}", marks=marks)
    for fmt in INNER
    for m, dtype, config, marks in (
        (3, "float32", "sub4", ()),
        (17, "bfloat16", "sub4", pytest.mark.slow),
        (40, "bfloat16", "sub8-bm32", ()),
    )
]


@functools.cache
def weight(fmt: str):
    shape = (OUT, INNER[fmt])
    return pack(random_gguf_bytes(np.random.default_rng(1), fmt, shape, realistic=True), fmt, shape)


@pytest.mark.parametrize("fmt, m, dtype, config_name", CASES)
def test_gemm_kernel_matches_the_reference(fmt, m, dtype, config_name):
    from ember.compiler.kernels.gguf_gemm.kernel import quant_gemm_kernel

    w = weight(fmt)
    x = np.random.default_rng(m).standard_normal((m, INNER[fmt])).astype(DTYPES[dtype])
    expected = np.asarray(quant_matmul_ref(jnp.asarray(x).astype(jnp.float32), w))
    plan = gemm_plan(fmt, m, OUT, INNER[fmt], CONFIGS[config_name])
    y = HostBuffer(np.full((m, OUT), np.nan, DTYPES[dtype]))
    planes = [HostBuffer(np.asarray(p)) for p in plane_args(w)]
    quant_gemm_kernel[plan["grid"]](HostBuffer(x), *planes, y, IEEE=dtype == "float32", **plan["meta"])
    got = y.array.astype(np.float32)
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    tol = 1e-5 if dtype == "float32" else 1e-2
    assert err < tol, f"{fmt} m={m} {dtype} {plan['meta']}: rel_err={err:.1e} (tolerance {tol})"
