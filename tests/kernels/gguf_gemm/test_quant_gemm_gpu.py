"""The quantized GEMM (compiler/kernels/gguf_gemm/) against the jnp reference on an NVIDIA GPU: every format, the
engine's projection shapes, ragged row counts from a decode bucket to a prefill chunk, every config of the
pick table and a few others. Skipped as a module without a GPU (JAX_PLATFORMS=cuda on the GPU machine)."""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.gguf_gemm import CONFIGS, GemmConfig, quant_gemm  # noqa: E402
from ember.compiler.kernels.gguf_gemv import FORMATS, pack, quant_matmul_ref, random_gguf_bytes  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [(2048, 1536), (1536, 8960), (1000, 2560), (4096, 640)]  # 1000: a masked column tile; 640: no 256-blocks


@functools.lru_cache(maxsize=4)
def device_weight(fmt: str, shape: tuple[int, int]):
    raw = random_gguf_bytes(np.random.default_rng(zlib.crc32(f"{fmt}{shape}".encode())), fmt, shape, realistic=True)
    return jax.device_put(pack(raw, fmt, shape))


def check(fmt, shape, m, dtype, config=None):
    w = device_weight(fmt, shape)
    x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(dtype)
    got = jax.jit(functools.partial(quant_gemm, config=config))(x, w)
    assert got.shape == (m, shape[0]) and got.dtype == dtype
    expected = np.asarray(jax.jit(quant_matmul_ref)(x.astype(jnp.float32), w))
    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-4
    np.testing.assert_allclose(
        np.asarray(got.astype(jnp.float32)), expected, rtol=tol, atol=tol * float(np.abs(expected).max())
    )


@pytest.mark.parametrize(
    "fmt, shape",
    [(f, s) for f in FORMATS for s in SHAPES if s[1] % FORMATS[f][0] == 0],  # K-quants: whole 256-element blocks
    ids=lambda v: v if isinstance(v, str) else f"{v[0]}x{v[1]}",
)
@pytest.mark.parametrize("m", [3, 17, 64, 300, 2048])
def test_gemm_matches_reference(fmt, shape, m):
    check(fmt, shape, m, jnp.bfloat16)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [5, 130])
def test_gemm_in_float32_is_ieee(fmt, m):
    check(fmt, (1000, 2560), m, jnp.float32)


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
@pytest.mark.parametrize(
    "config",
    [c for _, c in CONFIGS] + [GemmConfig(block_m=32, block_n=128, sub=8, group_m=1, num_warps=4, num_stages=2)],
    ids=str,
)
def test_every_config_matches_reference(fmt, config):
    check(fmt, (1000, 2560), 200, jnp.bfloat16, config)
