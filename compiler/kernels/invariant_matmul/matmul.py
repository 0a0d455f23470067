"""invariant_matmul: the deterministic plans' projection, y [M, N] = x [M, K] @ w [N, K]^T, one row's bits the
same at every M (config.py). On a GPU trace it launches kernel.py as a native XLA kernel: few rows as one
program per (row tile, column tile, split) plus the partials' fixed-order sum, many rows as one program per
tile walking the splits in order. Elsewhere it is reference.py's jnp form."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.triton.available import triton_available

from .config import launch, pick_config, split_programs
from .reference import fixed_order_partials_sum, invariant_matmul_reference


def invariant_matmul(x: jax.Array, w: jax.Array, out_dtype=None, *, split_form: bool | None = None) -> jax.Array:
    # x [M, K], w [N, K] -> [M, N]; split_form forces one of the two forms (tests and benchmarks: same bits)
    rows, k = x.shape
    n = w.shape[0]
    config = pick_config(n, k)
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    w = w.astype(x.dtype)
    if not triton_available():
        return invariant_matmul_reference(x, w, config, out_dtype)
    from ember.compiler.kernels.triton.launch import triton_call

    from .kernel import invariant_matmul_kernel

    as_programs = (split_programs(rows) if split_form is None else split_form) and config.splits(k) > 1
    plan = launch(config, rows, n, k, as_programs, ieee=x.dtype == jnp.float32)
    out_shape = (plan["meta"]["SPLITS"], rows, n) if as_programs else (rows, n)
    out = triton_call(
        x,
        w,
        kernel=invariant_matmul_kernel,
        out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32 if as_programs else out_dtype),
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **plan["meta"],
    )
    return fixed_order_partials_sum(out).astype(out_dtype) if as_programs else out
