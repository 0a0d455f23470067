"""invariant_matmul: the deterministic plans' projection, y [M, N] = x [M, K] @ w [N, K]^T, one row's bits the
same at every M (config.py). On a GPU trace it launches kernel.py as a native XLA kernel: few rows as one
program per (row tile, column tile, split) plus the partials' fixed-order sum, many rows as one program per
tile walking the splits in order. Elsewhere it is reference.py's jnp form.

w is a dense [N, K] array or a GGUF QuantizedWeight the kernel decodes from its packed planes (`packable`): the
same bits as its dense copy (kernel.py), reading ~3.5x fewer bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.gguf_gemm.gemm import PLANES, plane_args
from ember.compiler.kernels.gguf_gemv.layout import QuantizedWeight
from ember.compiler.kernels.gguf_gemv.reference import dequantize
from ember.compiler.kernels.triton.available import triton_available

from .config import InvariantMatmulConfig, launch, pick_config, split_programs
from .reference import fixed_order_partials_sum, invariant_matmul_reference


def packable(w, config: InvariantMatmulConfig) -> bool:
    """Whether the kernel multiplies w from its packed planes: a whole (unsplit) GGUF weight of a format it
    decodes, whose K tiles are whole 32-element groups inside one 256-element super-block."""
    return (
        isinstance(w, QuantizedWeight)
        and w.split is None
        and w.format in PLANES
        and w.shape[1] % config.block_k == 0
        and 256 % config.block_k == 0
        and config.block_k % 32 == 0
        and all(plane.size < 2**31 for plane in w.planes.values())  # the tile decoders' offsets are int32
    )


def invariant_matmul(
    x: jax.Array,
    w,
    out_dtype=None,
    *,
    split_form: bool | None = None,
    config: InvariantMatmulConfig | None = None,
) -> jax.Array:
    # x [M, K], w [N, K] (an array, or a QuantizedWeight: see packable) -> [M, N]; split_form forces one of the two
    # forms (tests and benchmarks: same bits); config: the whole weight's when w is one part of a group
    rows, k = x.shape
    n = int(w.shape[0])
    config = config or pick_config(n, k)
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    packed = packable(w, config) and triton_available()
    if isinstance(w, QuantizedWeight) and not packed:
        w = dequantize(w)  # the values a packed tile decodes to (exact in fp32, rounded once below)
    if not packed:
        w = w.astype(x.dtype)
    if not triton_available():
        return invariant_matmul_reference(x, w, config, out_dtype)
    from ember.compiler.kernels.triton.launch import triton_call

    from .kernel import invariant_matmul_kernel

    as_programs = (split_programs(rows) if split_form is None else split_form) and config.splits(k) > 1
    fmt = w.format if packed else "dense"
    plan = launch(config, rows, n, k, as_programs, ieee=x.dtype == jnp.float32, fmt=fmt)
    out_shape = (plan["meta"]["SPLITS"], rows, n) if as_programs else (rows, n)
    out = triton_call(
        x,
        *(plane_args(w) if packed else (w,) * 4),
        kernel=invariant_matmul_kernel,
        out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32 if as_programs else out_dtype),
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        **plan["meta"],
    )
    return fixed_order_partials_sum(out).astype(out_dtype) if as_programs else out
