"""The NVFP4 matmul kernel against the jnp reference on an NVIDIA GPU (JAX_PLATFORMS=cuda): decode and prefill
row counts, engine projection shapes, a masked column tile, bf16 and f32."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.nvfp4 import Nvfp4Weight, nvfp4_matmul, nvfp4_matmul_ref, quantize_nvfp4  # noqa: E402

pytestmark = pytest.mark.gpu


@functools.lru_cache(maxsize=2)
def device_weight(shape):
    packed, scales, global_scale = quantize_nvfp4(np.random.default_rng(0).standard_normal(shape) * 0.02)
    return jax.device_put(Nvfp4Weight(packed, scales.view(np.uint8), np.full(shape[0], global_scale, np.float32)))


@pytest.mark.parametrize("shape", [(4096, 4096), (1000, 2560), (14336, 4096)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 3, 16, 40, 300])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_kernel_matches_reference(shape, m, dtype):
    w = device_weight(shape)
    x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(dtype)
    got = jax.jit(functools.partial(nvfp4_matmul, backend="triton"))(x, w)
    expected = np.asarray(jax.jit(nvfp4_matmul_ref)(x.astype(jnp.float32), w))
    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-4
    np.testing.assert_allclose(
        np.asarray(got.astype(jnp.float32)), expected, rtol=tol, atol=tol * float(np.abs(expected).max())
    )
