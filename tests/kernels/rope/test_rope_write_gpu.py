"""The RoPE + K/V write kernel (compiler/kernels/rope/kv_write.py) against rope.py's reference and
attention.py's pool write, on an NVIDIA GPU: q and the written k within one rounding of the activation dtype,
v and every slot not written bit-equal. Skipped off the GPU (see tests/kernels/gguf_gemv/test_quant_matmul_gpu.py);
`tools/dev/h200_run.sh tests` runs it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.kernels.attention.reference import _write  # noqa: E402
from ember.compiler.kernels.rope.kv_write import rope_write  # noqa: E402
from ember.compiler.kernels.rope.reference import inv_frequencies, rope  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "n, hq, hkv, dh, style",
    [(1, 12, 2, 128, "neox"), (7, 32, 8, 128, "neox"), (300, 14, 2, 64, "interleaved"), (2, 8, 8, 256, "neox")],
)
@pytest.mark.parametrize(
    "dtype, pool_dtype",
    [(jnp.bfloat16, None), (jnp.float32, None), (jnp.bfloat16, jnp.float8_e4m3fn)],
    ids=["bf16", "f32", "bf16-fp8kv"],
)
def test_kernel_matches_rope_then_write(n, hq, hkv, dh, style, dtype, pool_dtype):
    # an FP8 pool (EngineConfig.kv_cache_dtype="fp8"): k within one e4m3 rounding (k rounded to bf16 first, whose
    # last bit may differ), v bit-equal (bf16 -> e4m3 rounds once, to nearest even, in XLA and in the kernel)
    keys = jax.random.split(jax.random.key(n * hq + dh), 6)
    q = jax.random.normal(keys[0], (n, hq, dh)).astype(dtype)
    k, v = (jax.random.normal(key, (n, hkv, dh)).astype(dtype) for key in keys[1:3])
    blocks, block_size = (n + 15) // 16 + 2, 16
    positions = jax.random.randint(keys[3], (n,), 0, 32768, jnp.int32)
    slots = jax.random.permutation(keys[4], blocks * block_size)[:n].astype(jnp.int32)
    pools = [
        jax.random.normal(key, (blocks, block_size, hkv, dh)).astype(pool_dtype or dtype)
        for key in jax.random.split(keys[5])
    ]
    inv_freq = jnp.asarray(inv_frequencies(theta=5e5, head_dim=dh))
    want_q, want_k = rope(q, k, positions, inv_freq, style=style)
    want = [_write(pools[0], slots, want_k), _write(pools[1], slots, v)]
    got_q, got_k, got_v = jax.jit(lambda *a: rope_write(*a, style=style))(q, k, v, positions, inv_freq, slots, *pools)
    tol = 1e-5 if dtype == jnp.float32 else 2**-7
    for got, ref, bound in ((got_q, want_q, tol), (got_k, want[0], tol if pool_dtype is None else 2**-3)):
        got, ref = np.asarray(got, np.float32), np.asarray(ref, np.float32)
        assert np.max(np.abs(got - ref) / (np.abs(ref) + 1e-2)) <= bound
    assert got_k.dtype == got_v.dtype == (pool_dtype or dtype)
    np.testing.assert_array_equal(np.asarray(got_v, np.float32), np.asarray(want[1], np.float32))
