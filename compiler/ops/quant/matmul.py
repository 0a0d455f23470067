"""quant_matmul: x [m, in] @ W.T for a quantized W [out, in], by a static backend.

backend="reference"  the plain jnp reference (dequantize, then an fp32 matmul); runs anywhere
backend="triton"     the Triton GEMV kernels (triton_kernels.py), native XLA kernels; NVIDIA GPUs only
backend="mosaic"     reserved for a Pallas Mosaic GPU kernel (not written yet: raises)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.ops.quant.config import QuantMatmulConfig, pick_config
from ember.compiler.ops.quant.layout import FORMATS, Q8_0, QuantizedWeight
from ember.compiler.ops.quant.ref import quant_matmul_ref

BACKENDS = ("reference", "triton", "mosaic")
DOT_BLOCK_M = 16  # tl.dot needs >= 16 rows: activations are padded (masked) to 16 per program


def quant_matmul(x: jax.Array, w: QuantizedWeight, *, backend: str = "reference",
                 config: QuantMatmulConfig | None = None) -> jax.Array:
    """x [m, in] (bf16 or f32) @ dequant(W).T -> [m, out] in x's dtype, accumulated in fp32."""
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x {x.shape} does not match a weight of shape {w.shape}")
    if backend == "reference":
        return quant_matmul_ref(x, w)
    if backend == "triton":
        return triton_quant_matmul(x, w, config or pick_config(w.format, x.shape[0], *w.shape))
    if backend == "mosaic":
        raise NotImplementedError("quant_matmul: the Pallas Mosaic GPU kernel is not written yet; use 'triton'")
    raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def launch_plan(fmt: str, m: int, out: int, inner: int, config: QuantMatmulConfig) -> dict:
    """The static launch parameters (grid and kernel constexprs) for one call; pure, testable on CPU."""
    block, _, _ = FORMATS[fmt]
    if config.variant == "rows":
        return _rows_plan(fmt, m, out, inner, config)
    if config.variant != "split":
        raise ValueError(f"unknown kernel variant {config.variant!r}")
    use_dot = config.dot_for(m)
    block_m = DOT_BLOCK_M if use_dot else 1
    if not use_dot and m != 1:
        raise ValueError("the CUDA-core path (use_dot=False) takes exactly one activation row")
    if config.block_n < 16 or config.block_n & (config.block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {config.block_n}")
    blocks = inner // block
    per_step = 1
    if fmt == Q8_0:  # the largest power of two <= blocks_per_step that divides the block count
        per_step = max(p for p in (1, 2, 4, 8, 16, 32) if p <= config.blocks_per_step and blocks % p == 0)
    steps = blocks // per_step
    split_k = max(1, min(config.split_k, steps))
    steps_per_split = -(-steps // split_k)
    split_k = -(-steps // steps_per_split)  # no empty splits
    meta = dict(M=m, N=out, K=inner, BLOCK_M=block_m, BLOCK_N=config.block_n,
                STEPS_PER_SPLIT=steps_per_split, USE_DOT=use_dot)
    if fmt == Q8_0:
        meta["BLOCKS_PER_STEP"] = per_step
    grid = (-(-out // config.block_n), split_k, -(-m // block_m))
    return {"grid": grid, "split_k": split_k, "meta": meta}


def _rows_plan(fmt: str, m: int, out: int, inner: int, config: QuantMatmulConfig) -> dict:
    from ember.compiler.ops.quant.triton_gemv import ROWS_MAX_M

    if fmt != "q4_k":
        raise ValueError(f"the rows variant has no {fmt} kernel yet")
    if not 1 <= m <= ROWS_MAX_M:
        raise ValueError(f"the rows variant takes 1..{ROWS_MAX_M} activation rows, got {m}")
    if config.block_n < 16 or config.block_n & (config.block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {config.block_n}")
    s = config.sb_per_step
    if s < 1 or s & (s - 1):
        raise ValueError(f"sb_per_step must be a power of two, got {s}")
    steps = -(-(inner // 256) // s)
    meta = dict(M=m, N=out, K=inner, BLOCK_N=config.block_n, S=s, PREFETCH=bool(config.prefetch and steps > 1))
    return {"grid": (-(-out // config.block_n), 1, 1), "split_k": 1, "meta": meta}


def triton_quant_matmul(x: jax.Array, w: QuantizedWeight, config: QuantMatmulConfig) -> jax.Array:
    from ..triton_launch import triton_call  # Triton itself is imported on use (GPU-only dependency)

    from ember.compiler.ops.quant.triton_kernels import KERNELS

    if x.dtype not in (jnp.bfloat16, jnp.float32, jnp.float16):
        raise ValueError(f"activations must be bf16, f16 or f32, got {x.dtype}")
    m = x.shape[0]
    out, inner = w.shape
    if config.variant == "rows":
        from ember.compiler.ops.quant.triton_gemv import ROWS_KERNELS
        kernel, plane_names = ROWS_KERNELS[w.format]
    else:
        kernel, plane_names = KERNELS[w.format]
    for name in plane_names:
        if w.planes[name].size >= 2**31:
            raise ValueError(f"{w.format} plane {name!r} has {w.planes[name].size} elements; int32 offsets overflow")
    plan = launch_plan(w.format, m, out, inner, config)
    split_k = plan["split_k"]
    out_dtype = x.dtype if split_k == 1 else jnp.float32
    if config.variant == "rows":  # one launch, [m, out] in x's dtype: nothing before or after it
        return triton_call(
            x, *(w.planes[name] for name in plane_names), kernel=kernel,
            out_shape=jax.ShapeDtypeStruct((m, out), x.dtype), grid=plan["grid"],
            num_warps=config.num_warps, num_stages=config.num_stages, **plan["meta"])
    y = triton_call(
        x, *(w.planes[name] for name in plane_names),
        kernel=kernel,
        out_shape=jax.ShapeDtypeStruct((split_k, m, out), out_dtype),
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        IEEE=x.dtype == jnp.float32,
        **plan["meta"],
    )
    if split_k == 1:
        return y[0]
    return jnp.sum(y, axis=0).astype(x.dtype)
