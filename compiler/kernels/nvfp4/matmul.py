"""nvfp4_matmul: x [m, in] @ W.T for an NVFP4 W (reference.py), by the Triton kernel (kernel.py) on a GPU or the
jnp reference elsewhere; its launch plan (pure, testable on CPU)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ember.compiler.kernels.nvfp4.reference import GROUP, Nvfp4Weight, nvfp4_matmul_ref


@dataclass(frozen=True)
class Nvfp4Config:
    block_m: int = 16
    block_n: int = 64
    block_k: int = 128  # a multiple of 32 (two halves of whole 16-element groups)
    num_warps: int = 4
    num_stages: int = 3


def pick_nvfp4_config(m: int) -> Nvfp4Config:
    """Few rows: 16-row tiles (the MMA's least) over narrow column tiles, many programs for the bandwidth;
    many rows: 64 x 128 tiles, each weight tile decoded once for 64 rows."""
    if m <= 16:
        return Nvfp4Config()
    if m <= 64:
        return Nvfp4Config(block_m=32, block_n=64, block_k=128)
    return Nvfp4Config(block_m=64, block_n=128, block_k=128, num_warps=8)


def nvfp4_plan(m: int, out: int, inner: int, config: Nvfp4Config) -> dict:
    """Grid and constexprs of one call; the K tile shrinks to a divisor of the row (rows are whole 32s)."""
    if inner % (2 * GROUP):
        raise ValueError(f"NVFP4 rows must be a multiple of {2 * GROUP} elements, got {inner}")
    block_k = config.block_k
    while inner % block_k:
        block_k //= 2
    if block_k < 2 * GROUP:
        raise ValueError(f"block_k must be a power of two >= {2 * GROUP}, got {config.block_k}")
    meta = dict(M=m, N=out, K=inner, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=block_k)
    return {"grid": (-(-out // config.block_n), -(-m // config.block_m), 1), "meta": meta}


def nvfp4_matmul(x: jax.Array, w: Nvfp4Weight, *, backend: str = "reference", config: Nvfp4Config | None = None):
    """x [m, in] (bf16, f16 or f32) @ dequant(W).T -> [m, out] in x's dtype, fp32 accumulation."""
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x {x.shape} does not match an NVFP4 weight of shape {w.shape}")
    if backend != "triton":
        return nvfp4_matmul_ref(x, w)
    from ember.compiler.kernels.nvfp4.kernel import nvfp4_matmul_kernel
    from ember.compiler.kernels.triton.launch import triton_call

    if x.size >= 2**31 or w.packed.size >= 2**31:
        raise ValueError("nvfp4_matmul: int32 offsets overflow")
    m = x.shape[0]
    config = config or pick_nvfp4_config(m)
    plan = nvfp4_plan(m, *w.shape, config)
    return triton_call(
        x,
        w.packed,
        w.scales,
        w.row_scale,
        kernel=nvfp4_matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, w.shape[0]), x.dtype),
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        IEEE=x.dtype == jnp.float32,
        **plan["meta"],
    )
