"""Check the RoPE + K/V write kernel (compiler/kernels/rope/kv_write.py) without a GPU (triton==3.6.0).

  python -m ember.tools.dev.check_rope_kernels interpret   run it in Triton's CPU interpreter against rope.py's
                                                       reference and attention.py's pool write: CASES
Interpreter patches: tools/dev/check_norm_kernels.py's (numpy buffers, bf16 through fp32, round to nearest even).
"""

from __future__ import annotations

import sys

import numpy as np

# (tokens, hq, hkv, dh, style, dtype name[, pool dtype name]): the benchmark shapes' heads (12/2 x 128, 32/8 x
# 128), a head count that is not a power of two (masked head tile), both rotation styles, positions up to 32k, and
# FP8 (e4m3) pools under bf16 (kv_cache_dtype="fp8": k rounded to bf16, then to the pool's e4m3)
CASES = [
    (1, 12, 2, 128, "neox", "bfloat16"),
    (5, 32, 8, 128, "neox", "bfloat16"),
    (3, 6, 3, 64, "interleaved", "float32"),
    (4, 4, 1, 32, "neox", "float32"),
    (2, 12, 2, 128, "interleaved", "bfloat16"),
    (5, 32, 8, 128, "neox", "bfloat16", "float8_e4m3fn"),
]
BLOCKS, BLOCK_SIZE = 6, 4


def interpret() -> int:
    from ember.tools.dev.check_norm_kernels import patch_interpreter_rne

    patch_interpreter_rne()
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.attention.reference import _write
    from ember.compiler.kernels.rope.kv_write import launch_plan, rope_write_kernel
    from ember.compiler.kernels.rope.reference import inv_frequencies, rope
    from ember.tools.dev.check_quant_kernels import HostBuffer

    failures = 0
    rng = np.random.default_rng(0)
    for n, hq, hkv, dh, style, dtype_name, *pool_name in CASES:
        dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
        pool_dtype = getattr(ml_dtypes, pool_name[0]) if pool_name else dtype
        q, k, v = (rng.standard_normal((n, heads, dh)).astype(dtype) for heads in (hq, hkv, hkv))
        positions = rng.integers(0, 32768, n).astype(np.int32)
        slots = rng.choice(BLOCKS * BLOCK_SIZE, n, replace=False).astype(np.int32)
        inv_freq = inv_frequencies(theta=1e6, head_dim=dh)
        pools = [rng.standard_normal((BLOCKS, BLOCK_SIZE, hkv, dh)).astype(pool_dtype) for _ in range(2)]
        want_q, want_k = rope(
            jnp.asarray(q), jnp.asarray(k), jnp.asarray(positions), jnp.asarray(inv_freq), style=style
        )
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
        err = lambda got, ref: float(np.max(np.abs(got.astype(np.float32) - ref) / (np.abs(ref) + 1e-2)))
        errs = (err(q_out.array, np.asarray(want_q).astype(np.float32)), err(k_pool.array, want_kp))
        v_equal = np.array_equal(v_pool.array.astype(np.float32), want_vp)
        bad = not v_equal or errs[0] > tol or errs[1] > k_tol
        failures += bad
        print(
            f"{'BAD' if bad else 'ok '} n={n} heads={hq}/{hkv} dh={dh} {style:11} {dtype_name:8} "
            f"pools {np.dtype(pool_dtype).name} "
            f"rel_err q={errs[0]:.1e} k_pool={errs[1]:.1e} v_pool_equal={v_equal}",
            flush=True,
        )
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    from ember.tools.dev.check_norm_kernels import interpret_cli

    return interpret_cli(__doc__, interpret, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
