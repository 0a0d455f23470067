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


@pytest.mark.parametrize(
    "fmt, n, k", [("q4_k", 2048, 1536), ("q6_k", 1536, 8960), ("q8_0", 1000, 1536), ("q5_0", 96, 4096)]
)
def test_packed_weights_give_the_dense_copys_bits(fmt, n, k):
    """The kernel decoding the packed planes gives, at every row count and in both forms, the bits of the same
    kernel over the dense copy made at load, so a plan may read either form for any step."""
    from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
    from ember.compiler.kernels.gguf_gemv.reference import dequantize

    w = jax.device_put(pack(random_gguf_bytes(np.random.default_rng(n), fmt, (n, k), realistic=True), fmt, (n, k)))
    dense = jax.jit(lambda w: dequantize(w).astype(jnp.bfloat16))(w)
    x = jax.random.normal(jax.random.key(k), (max(ROWS), k), jnp.float32).astype(jnp.bfloat16)
    f = jax.jit(invariant_matmul, static_argnames="split_form")
    whole = np.asarray(f(x, dense, split_form=False).astype(jnp.float32))
    for split_form in (False, True):
        got = np.asarray(f(x[:256], w, split_form=split_form).astype(jnp.float32))
        np.testing.assert_array_equal(got, whole[:256], err_msg=f"split_form={split_form}")
    for rows in ROWS:
        np.testing.assert_array_equal(np.asarray(f(x[:rows], w).astype(jnp.float32)), whole[:rows], err_msg=f"{rows}")
