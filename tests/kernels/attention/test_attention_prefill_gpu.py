"""The Triton prefill (chunk) attention kernel against the reference `attention._attend`, on an NVIDIA GPU.

Skipped as a whole where jax-triton or a GPU is missing (CI is CPU-only; the conftest pins
JAX_PLATFORMS=cpu unless the variable is set, so run with JAX_PLATFORMS=cuda on the GPU machine):
  JAX_PLATFORMS=cuda python -m pytest -q -m gpu tests/kernels/attention/test_attention_prefill_gpu.py
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.attention.prefill import PrefillAttentionConfig, prefill_attention  # noqa: E402
from ember.compiler.kernels.attention.reference import _attend  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [  # chunk, valid tokens, cached prefix, hq, hkv, dh, page, window, launch config (None: the default)
    (16, 16, 0, 12, 2, 128, 16, 0, None),
    (16, 11, 12288, 32, 8, 128, 16, 0, None),  # a short chunk after a long prefix: KV splits
    (64, 50, 300, 32, 8, 128, 16, 0, None),
    (512, 512, 12288, 12, 2, 128, 16, 0, None),
    (512, 400, 1000, 16, 16, 64, 32, 0, None),  # G = 1, dh 64, 32-token pages
    (1024, 1000, 3000, 4, 1, 256, 16, 512, None),  # a Gemma-3 sliding layer: dh 256, blocks handed back
    (2048, 2048, 0, 12, 2, 128, 16, 1024, None),
    (4096, 4000, 0, 32, 8, 128, 32, 0, None),
    (4096, 4096, 12288, 8, 1, 128, 16, 0, None),  # the last 4k of a 16k prompt
    (16384, 16384, 0, 8, 2, 128, 16, 0, None),  # one 16k chunk
    (256, 200, 5000, 12, 2, 128, 16, 0, PrefillAttentionConfig(block_m=64, block_n=128, num_warps=4, kv_splits=3)),
    (128, 128, 700, 48, 8, 128, 16, 100, PrefillAttentionConfig(block_m=128, block_n=32, kv_splits=5)),  # G = 6
]
TOLERANCE = {jnp.bfloat16: 1e-2, jnp.float32: 1e-4}  # rtol and atol: bf16 rounds P and the output
QUERY_SLICE = 1024  # the reference runs this many queries at a time (its scores are [hq, slice, S] fp32)


def make_case(chunk, valid, prefix, hq, hkv, dh, page, window, dtype, seed=0, width=None):
    width = width or -(-(prefix + chunk) // page) + 1  # one spare block past the context
    num_blocks = width + 3
    rng = np.random.default_rng(seed)
    shape = (num_blocks, page, hkv, dh)
    k_pool = jnp.asarray(rng.standard_normal(shape, np.float32) * 2, dtype)  # garbage outside the context too
    v_pool = jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
    table = rng.permutation(np.arange(1, num_blocks))[:width].astype(np.int32)
    if window > 0:
        table[: max(0, prefix - window + 1) // page] = 0  # handed back by the sliding kind
    q = jnp.asarray(rng.standard_normal((chunk, hq, dh), np.float32), dtype)
    positions = np.zeros(chunk, np.int32)
    positions[:valid] = np.arange(prefix, prefix + valid)
    return q, k_pool, v_pool, jnp.asarray(table), jnp.asarray(positions)


@functools.partial(jax.jit, static_argnames="scale")
def reference_slice(q, keys, values, positions, window, *, scale):
    with jax.default_matmul_precision("highest"):  # XLA GPU's default fp32 matmul is TF32 (~1e-3 relative)
        return _attend(q[None], keys[None], values[None], positions[None], window, scale)[0]


def reference(q, k_pool, v_pool, table, positions, window, scale, valid):
    _, page, hkv, dh = k_pool.shape
    keys = k_pool.astype(jnp.float32)[table].reshape(-1, hkv, dh)
    values = v_pool.astype(jnp.float32)[table].reshape(-1, hkv, dh)
    parts = [
        reference_slice(
            q[i : i + QUERY_SLICE].astype(jnp.float32),
            keys,
            values,
            positions[i : i + QUERY_SLICE],
            window,
            scale=scale,
        )
        for i in range(0, valid, QUERY_SLICE)
    ]
    return np.concatenate([np.asarray(p) for p in parts])[:valid]


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=lambda c: f"C{c[0]}-n{c[1]}-p{c[2]}-{c[3]}x{c[4]}x{c[5]}-pg{c[6]}-w{c[7]}" + ("-cfg" if c[8] else ""),
)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_kernel_matches_reference(case, dtype) -> None:
    chunk, valid, prefix, hq, hkv, dh, page, window, config = case
    q, k_pool, v_pool, table, positions = make_case(chunk, valid, prefix, hq, hkv, dh, page, window, dtype)
    scale = dh**-0.5
    run = jax.jit(functools.partial(prefill_attention, scale=scale, config=config))
    got = run(q, k_pool, v_pool, table, positions, None, jnp.int32(window))  # valid rows from positions
    assert got.shape == q.shape and got.dtype == dtype
    got = np.asarray(got.astype(jnp.float32))
    assert np.isfinite(got).all()  # padding rows too
    expected = reference(q, k_pool, v_pool, table, positions, jnp.int32(window), scale, valid)
    np.testing.assert_allclose(got[:valid], expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_one_compiled_kernel_serves_every_chunk_of_a_bucket() -> None:
    """num_tokens, the start position and the window are device values: no recompile, no host sync."""
    run = jax.jit(functools.partial(prefill_attention, scale=128**-0.5))
    for valid, prefix, window in ((256, 0, 0), (100, 37, 0), (256, 900, 64), (1, 1200, 0)):
        q, k_pool, v_pool, table, positions = make_case(
            256, valid, prefix, 12, 2, 128, 16, window, jnp.bfloat16, width=100
        )  # one table width and pool for the bucket
        got = np.asarray(run(q, k_pool, v_pool, table, positions, jnp.int32(valid), jnp.int32(window)), np.float32)
        expected = reference(q, k_pool, v_pool, table, positions, jnp.int32(window), 128**-0.5, valid)
        np.testing.assert_allclose(got[:valid], expected, rtol=1e-2, atol=1e-2)
    assert run._cache_size() == 1
