"""The RoPE + K/V write kernel (compiler/kernels/rope/kv_write.py) in Triton's CPU interpreter against
rope/reference.py's rotation and attention/reference.py's pool write."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from interpreter import HostBuffer

from ember.compiler.kernels.attention.reference import _write
from ember.compiler.kernels.rope.kv_write import launch_plan, rope_write_kernel
from ember.compiler.kernels.rope.reference import inv_frequencies, rope

pytestmark = pytest.mark.interpret

# (tokens, hq, hkv, dh, style, dtype name, pool dtype name): the benchmark shapes' heads (12/2 x 128, 32/8 x
# 128), a head count that is not a power of two (masked head tile), both rotation styles, positions up to 32k, and
# FP8 (e4m3) pools under bf16 (kv_cache_dtype="fp8": k rounded to bf16, then to the pool's e4m3)
CASES = [
    (1, 12, 2, 128, "neox", "bfloat16", None),
    (5, 32, 8, 128, "neox", "bfloat16", None),
    (3, 6, 3, 64, "interleaved", "float32", None),
    (4, 4, 1, 32, "neox", "float32", None),
    (2, 12, 2, 128, "interleaved", "bfloat16", None),
    (5, 32, 8, 128, "neox", "bfloat16", "float8_e4m3fn"),
]
BLOCKS, BLOCK_SIZE = 6, 4  # the pools: [BLOCKS, BLOCK_SIZE, hkv, dh]


def _id(case) -> str:
    n, hq, hkv, dh, style, dtype_name, pool_name = case
    return f"n{n}-{hq}/{hkv}x{dh}-{style}-{dtype_name}" + (f"-pool_{pool_name}" if pool_name else "")


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float32) - ref) / (np.abs(ref) + 1e-2)))


@pytest.mark.parametrize(
    "seed, n, hq, hkv, dh, style, dtype_name, pool_name",
    [(seed, *case) for seed, case in enumerate(CASES)],
    ids=[_id(case) for case in CASES],
)
def test_rope_write_kernel_matches_reference(seed, n, hq, hkv, dh, style, dtype_name, pool_name):
    rng = np.random.default_rng(seed)
    dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
    pool_dtype = getattr(ml_dtypes, pool_name) if pool_name else dtype
    q, k, v = (rng.standard_normal((n, heads, dh)).astype(dtype) for heads in (hq, hkv, hkv))
    positions = rng.integers(0, 32768, n).astype(np.int32)
    slots = rng.choice(BLOCKS * BLOCK_SIZE, n, replace=False).astype(np.int32)
    inv_freq = inv_frequencies(theta=1e6, head_dim=dh)
    pools = [rng.standard_normal((BLOCKS, BLOCK_SIZE, hkv, dh)).astype(pool_dtype) for _ in range(2)]
    want_q, want_k = rope(jnp.asarray(q), jnp.asarray(k), jnp.asarray(positions), jnp.asarray(inv_freq), style=style)
    want_kp = np.asarray(_write(jnp.asarray(pools[0]), jnp.asarray(slots), want_k)).astype(np.float32)
    want_vp = np.asarray(_write(jnp.asarray(pools[1]), jnp.asarray(slots), jnp.asarray(v))).astype(np.float32)
    q_out = HostBuffer(np.zeros_like(q))
    k_pool, v_pool = HostBuffer(pools[0].copy()), HostBuffer(pools[1].copy())
    plan = launch_plan(n, hq, hkv, dh, style)
    # the pools are passed twice (input, aliased output), as the XLA launch passes one buffer for both
    rope_write_kernel[plan["grid"]](
        HostBuffer(q),
        HostBuffer(k),
        HostBuffer(v),
        HostBuffer(positions),
        HostBuffer(inv_freq),
        HostBuffer(slots),
        k_pool,
        v_pool,
        q_out,
        k_pool,
        v_pool,
        **plan["meta"],
    )
    tol = 1e-5 if dtype_name == "float32" else 2**-7
    k_tol = tol if not pool_name else 2**-3  # one e4m3 step: k's bf16 rounding may differ by a bit first
    q_err = _rel_err(q_out.array, np.asarray(want_q).astype(np.float32))
    k_err = _rel_err(k_pool.array, want_kp)
    v_unequal = int((v_pool.array.astype(np.float32) != want_vp).sum())
    assert q_err <= tol, f"q: rel_err {q_err:.1e} > {tol:.1e}"
    assert k_err <= k_tol, f"k pool: rel_err {k_err:.1e} > {k_tol:.1e}"
    assert v_unequal == 0, f"v pool: {v_unequal} of {want_vp.size} elements differ from the reference's write"
