"""gated_delta/norm_kernel.py in Triton's CPU interpreter against reference.gated_rms_norm (per head): fp32 within
float rounding, bf16 within one rounding of bf16 (the kernel rounds where the reference rounds)."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.gated_delta.norm_kernel import gated_rms_norm_kernel, launch_plan
from ember.compiler.kernels.gated_delta.op import gated_rms_norm_heads

pytestmark = pytest.mark.interpret


@pytest.mark.parametrize(
    "rows, heads, n, dtype", [(3, 2, 16, "float32"), (2, 4, 24, "bfloat16"), (1, 1, 128, "bfloat16")]
)
def test_gated_norm_kernel_matches_reference(rows, heads, n, dtype):
    rng = np.random.default_rng(rows * n)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    x = (rng.standard_normal((rows, heads * n)) * 2).astype(np_dtype)
    z = rng.standard_normal((rows, heads * n)).astype(np_dtype)
    w = rng.uniform(0.5, 1.5, n).astype(np_dtype)
    want = np.asarray(
        gated_rms_norm_heads(jnp.asarray(x), jnp.asarray(z), jnp.asarray(w), eps=1e-6, heads=heads), np.float32
    )
    plan = launch_plan(rows * heads, n)
    out = HostBuffer(np.zeros((rows * heads, n), np_dtype))
    gated_rms_norm_kernel[plan["grid"]](
        HostBuffer(x), HostBuffer(z), HostBuffer(w), out, EPS=1e-6, ROUND_WN=True, **plan["meta"]
    )
    got = out.array.astype(np.float32).reshape(rows, heads * n)
    tol = 1e-5 if dtype == "float32" else 2**-7
    assert np.max(np.abs(got - want) / (np.abs(want) + 1e-2)) <= tol
