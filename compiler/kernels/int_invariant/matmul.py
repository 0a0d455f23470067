"""int_invariant_matmul: y [M, N] = x [M, K] @ W [N, K]^T for a GGUF-packed Q4_K / Q6_K W, each row the same bits at
every M (README.md). On a GPU trace: the activations quantized by quantize_kernel.py, then the dp4a GEMV
(gemv_kernel.py: split partials added here in split order) up to GEMV_MAX_ROWS rows, the int8 tensor-core GEMM
(gemm_kernel.py) above; the choice moves no bit. Elsewhere: reference.py's jnp form, the same arithmetic.

The deterministic projections (invariant_matmul/linear.py) take it under the policy's deterministic.int8_blocks, off
on every target until a GPU has run tests/kernels/int_invariant/test_int_invariant_gpu.py and
tools/dev/bench_int_invariant.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.kernels.gguf_gemm.gemm import plane_args
from ember.compiler.kernels.gguf_gemv.layout import QuantizedWeight
from ember.compiler.kernels.invariant_matmul.reference import fixed_order_partials_sum
from ember.compiler.kernels.triton.available import triton_available

from .config import (
    FORMATS,
    GEMV_MAX_ROWS,
    GemmLaunch,
    GemvLaunch,
    IntInvariantConfig,
    gemm_plan,
    gemv_plan,
    pick_config,
    pick_gemm_launch,
    pick_gemv_launch,
)
from .reference import int_invariant_reference


def supported(w) -> bool:
    """Whether w is a weight these kernels multiply: a whole (unsplit) Q4_K / Q6_K QuantizedWeight whose planes
    the kernels can index with int32 offsets."""
    return (
        isinstance(w, QuantizedWeight)
        and w.split is None
        and w.format in FORMATS
        and w.shape[1] % 256 == 0
        and all(plane.size < 2**31 for plane in w.planes.values())
    )


def quantize_gpu(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [m, k] -> (qa int32 [m, k/4], dx, sx float32 [m, k/32]) in one launch (reference.quantize_rows +
    pack_words, the same bits)."""
    from ember.compiler.kernels.triton.launch import triton_call

    from .quantize_kernel import quantize_kernel, quantize_plan

    m, k = x.shape
    plan = quantize_plan(m, k, asm=True)
    return triton_call(
        x,
        kernel=quantize_kernel,
        out_shape=(
            jax.ShapeDtypeStruct((m, k // 4), jnp.int32),
            jax.ShapeDtypeStruct((m, k // 32), jnp.float32),
            jax.ShapeDtypeStruct((m, k // 32), jnp.float32),
        ),
        grid=plan["grid"],
        num_warps=4,
        num_stages=1,
        **plan["meta"],
    )


def gemv(quantized, w: QuantizedWeight, config: IntInvariantConfig, launch: GemvLaunch | None = None) -> jax.Array:
    """The GEMV over quantize_gpu's output -> float32 [m, N] (its split partials added in split order)."""
    from ember.compiler.kernels.triton.launch import triton_call

    from .gemv_kernel import int_gemv_kernel

    qa, dx, sx = quantized
    rows, k = qa.shape[0], qa.shape[1] * 4
    launch = launch or pick_gemv_launch(rows)
    plan = gemv_plan(w.format, config, rows, w.shape[0], k, launch, asm=True)
    partials = triton_call(
        qa,
        dx,
        sx,
        *plane_args(w),
        kernel=int_gemv_kernel,
        out_shape=jax.ShapeDtypeStruct(plan["out_shape"], jnp.float32),
        grid=plan["grid"],
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        **plan["meta"],
    )
    return fixed_order_partials_sum(partials)


def gemm(quantized, w: QuantizedWeight, config: IntInvariantConfig, out_dtype, launch: GemmLaunch | None = None):
    """The GEMM over quantize_gpu's output -> [m, N] in out_dtype (the splits added in order inside each program)."""
    from ember.compiler.kernels.triton.launch import triton_call

    from .gemm_kernel import int_gemm_kernel

    qa, dx, sx = quantized
    rows, k = qa.shape[0], qa.shape[1] * 4
    xq = jax.lax.bitcast_convert_type(qa, jnp.int8).reshape(rows, k)  # the words' bytes, little-endian
    launch = launch or pick_gemm_launch(rows)
    plan = gemm_plan(w.format, config, rows, w.shape[0], k, launch, asm=True)
    return triton_call(
        xq,
        dx,
        sx,
        *plane_args(w),
        kernel=int_gemm_kernel,
        out_shape=jax.ShapeDtypeStruct(plan["out_shape"], out_dtype),
        grid=plan["grid"],
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        **plan["meta"],
    )


def int_invariant_matmul(
    x: jax.Array,
    w: QuantizedWeight,
    out_dtype=None,
    *,
    form: str | None = None,
    config: IntInvariantConfig | None = None,
) -> jax.Array:
    # x [M, K], w a Q4_K / Q6_K QuantizedWeight [N, K] -> [M, N] in out_dtype (x's by default). form: "gemv" or
    # "gemm" forces a kernel (tests and benchmarks: the same bits); config: the whole weight's, when w is a part
    return int_invariant_parts(x, (w,), out_dtype, form=form, config=config)[0]


def int_invariant_parts(
    x: jax.Array,
    parts,
    out_dtype=None,
    *,
    form: str | None = None,
    config: IntInvariantConfig | None = None,
) -> list[jax.Array]:
    """int_invariant_matmul of x by each part of a group (the parts side by side are one weight [sum N_i, K]; config:
    that whole weight's), the activations quantized once for all of them."""
    rows, k = x.shape
    for w in parts:
        if not supported(w) or w.shape[1] != k:
            raise ValueError(
                f"int_invariant_matmul: x {x.shape} against a weight it cannot take ({w.format}, {w.shape})"
            )
    config = config or pick_config(sum(w.shape[0] for w in parts), k)
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    if not triton_available():
        return [int_invariant_reference(x, w, config, out_dtype) for w in parts]
    quantized = quantize_gpu(x)
    form = form or ("gemv" if rows <= GEMV_MAX_ROWS else "gemm")
    if form == "gemv":
        # behind a barrier, the cast is a value of its own: XLA's excess-precision rewrites (convert pairs removed
        # under xla_allow_excess_precision) cannot skip this rounding in a consumer's fusion, as the GEMM's
        # output is already rounded in memory
        return [jax.lax.optimization_barrier(gemv(quantized, w, config).astype(out_dtype)) for w in parts]
    if form != "gemm":
        raise ValueError(f"int_invariant_matmul: form must be 'gemv' or 'gemm', got {form!r}")
    return [gemm(quantized, w, config, out_dtype) for w in parts]
