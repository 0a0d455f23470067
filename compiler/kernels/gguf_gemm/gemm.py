"""quant_gemm: x [m, in] @ W.T for a GGUF-packed W [out, in] by the Triton GEMM (kernel.py), for steps of many
rows; its launch configs and plans (pure, testable on CPU).

The launch config is picked by the row count (the step's bucket): few rows take a small BLOCK_M (the weight
tile's dequantization is then shared by fewer rows, but no MMA rows are wasted), many rows the full
128 x 128 tile. The table comes from tools/dev/bench_quant_gemm.py on the GPU; the kernel policy's
quant_gemv.gemm_config overrides its fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ember.compiler.kernels.gguf_gemv.layout import FORMATS, QuantizedWeight

# format -> plane names in the kernel's pointer order (p0..p3; shorter lists repeat their last plane)
PLANES: dict[str, tuple[str, ...]] = {
    "q4_k": ("qs", "scales", "d", "dmin"),
    "q6_k": ("ql", "qh", "scales", "d"),
    "q8_0": ("qs", "d"),
    "q5_0": ("qs", "qh", "d"),
}


@dataclass(frozen=True)
class GemmConfig:
    """One launch of quant_gemm_kernel: BLOCK_M x BLOCK_N outputs per program, K tiles of sub * 32 elements."""

    block_m: int = 64
    block_n: int = 128
    sub: int = 4  # 32-element groups per K tile (K-quants: 1, 2, 4 or 8, inside one super-block)
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


# (rows up to, config): the first whose bound holds
CONFIGS: tuple[tuple[int, GemmConfig], ...] = (
    (16, GemmConfig(block_m=16, block_n=64, sub=8, num_warps=4)),
    (32, GemmConfig(block_m=32, block_n=64, sub=8, num_warps=4)),
    (64, GemmConfig(block_m=64, block_n=128, sub=4, num_warps=8)),
    (1 << 62, GemmConfig(block_m=128, block_n=128, sub=4, num_warps=8)),
)


def pick_gemm_config(m: int, overrides: tuple[tuple[str, int], ...] = ()) -> GemmConfig:
    """The launch config for m activation rows, with the policy's field overrides applied."""
    config = next(c for bound, c in CONFIGS if m <= bound)
    return dataclasses.replace(config, **dict(overrides)) if overrides else config


def gemm_plan(fmt: str, m: int, out: int, inner: int, config: GemmConfig) -> dict:
    """Grid and constexprs of one call. The K tile shrinks to a divisor of the row length (Q8_0 / Q5_0 rows of
    any whole number of 32-element blocks); a K-quant tile stays inside its super-block."""
    if fmt not in PLANES:
        raise ValueError(f"quant_gemm has no {fmt} kernel")
    block = FORMATS[fmt][0]
    if inner % block:
        raise ValueError(f"{fmt}: `in` = {inner} is not a multiple of {block}")
    for name, value in (("block_m", config.block_m), ("block_n", config.block_n), ("sub", config.sub)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"quant_gemm: {name} must be a power of two, got {value}")
    if config.block_m < 16 or config.block_n < 16:
        raise ValueError("quant_gemm: tl.dot needs block_m and block_n >= 16")
    sub = min(config.sub, 8)
    while (inner // 32) % sub:
        sub //= 2
    if sub * 32 < 16:
        raise ValueError("quant_gemm: the K tile is shorter than one MMA")
    tiles = -(-m // config.block_m) * -(-out // config.block_n)
    meta = dict(
        M=m, N=out, K=inner, FMT=fmt, BLOCK_M=config.block_m, BLOCK_N=config.block_n, SUB=sub, GROUP_M=config.group_m
    )
    return {"grid": (tiles, 1, 1), "meta": meta}


def plane_args(w: QuantizedWeight) -> tuple:
    """The kernel's four plane pointers for w's format."""
    names = PLANES[w.format]
    return tuple(w.planes[names[min(i, len(names) - 1)]] for i in range(4))


def quant_gemm(x: jax.Array, w: QuantizedWeight, config: GemmConfig | None = None) -> jax.Array:
    """x [m, in] (bf16, f16 or f32) @ dequant(W).T -> [m, out] in x's dtype, fp32 accumulation. NVIDIA GPUs only."""
    from ember.compiler.kernels.gguf_gemm.kernel import quant_gemm_kernel
    from ember.compiler.kernels.triton.launch import triton_call  # Triton is imported on use (GPU-only)

    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x {x.shape} does not match a weight of shape {w.shape}")
    if x.dtype not in (jnp.bfloat16, jnp.float32, jnp.float16):
        raise ValueError(f"activations must be bf16, f16 or f32, got {x.dtype}")
    for name, plane in (("x", x), *w.planes.items()):
        if plane.size >= 2**31:
            raise ValueError(f"quant_gemm: {name} has {plane.size} elements; int32 offsets overflow")
    m = x.shape[0]
    config = config or pick_gemm_config(m)
    plan = gemm_plan(w.format, m, *w.shape, config)
    return triton_call(
        x,
        *plane_args(w),
        kernel=quant_gemm_kernel,
        out_shape=jax.ShapeDtypeStruct((m, w.shape[0]), x.dtype),
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        IEEE=x.dtype == jnp.float32,
        **plan["meta"],
    )
