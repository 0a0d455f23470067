"""The batch-invariant matmul (compiler/kernels/invariant_matmul/) on an NVIDIA GPU: a row's bits are the same at
every row count and in both forms (splits as programs, splits in one program), and the result matches a float64
product to bf16 rounding. Skipped off the GPU (tools/dev/h200_run.sh gpu-suite runs it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.invariant_matmul.matmul import invariant_matmul  # noqa: E402

pytestmark = pytest.mark.gpu

ROWS = (1, 2, 5, 16, 17, 100, 256, 257, 700)


@pytest.mark.parametrize("n, k", [(2048, 1536), (1536, 8960), (1000, 1000), (17920, 1536)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_rows_and_forms_give_the_same_bits(n, k, dtype):
    key = jax.random.key(n + k)
    x = jax.random.normal(key, (max(ROWS), k), jnp.float32).astype(dtype)
    w = (jax.random.normal(jax.random.fold_in(key, 1), (n, k), jnp.float32) * 0.05).astype(dtype)
    f = jax.jit(invariant_matmul, static_argnames="split_form")
    whole = np.asarray(f(x, w, split_form=False).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(f(x, w, split_form=True).astype(jnp.float32)), whole)
    for rows in ROWS:
        np.testing.assert_array_equal(np.asarray(f(x[:rows], w).astype(jnp.float32)), whole[:rows], err_msg=f"{rows}")
    want = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    assert np.abs(whole - want).max() / np.abs(want).max() < tol
