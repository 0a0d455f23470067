"""FP8 (e4m3) GEMV for decode: x [m, in] (m <= 16 rows) @ values.T with per-channel or 128 x 128 block scales.

Why a kernel: a decode step reads every weight once, so the projection is bound by HBM; XLA's fusion of the
fp8 -> bf16 convert into its GEMM streamed the fp8 matrix at ~0.5 of HBM bandwidth at batch 1 (8B shape).
This kernel reads each fp8 byte once, in wide contiguous tiles, with fp32 accumulation.

Layout and grid. values float8_e4m3fn [out, in] row-major (each row's `in` run contiguous). Grid
(cdiv(out, BLOCK_N), SPLIT_K): program (pid_n, pid_k) owns output rows pid_n * BLOCK_N + [0, BLOCK_N) and the
`in` range [pid_k * K_PER_SPLIT, +K_PER_SPLIT), walked in steps of BLOCK_K (rows past `out` and columns past
`in` are masked: they read 0). A tile row is BLOCK_K contiguous bytes: 16-byte vector loads.

Three inner loops (config.words, config.use_dot):
  words (the one-row picks): the CUDA-core sum over 4-byte words with an inline-PTX e4m3 conversion, x read
      as bf16 quads in the tile's own register layout; dense_gemv/words.py says why and how.
  CUDA cores (bytes): a step loads the tile [BLOCK_N, BLOCK_K]; with PREFETCH the next step's tile is loaded
      before this step's math (a register double buffer: Triton's pipeliner only makes cp.async stages for loads that
      feed a dot). acc [BLOCK_M, BLOCK_N, BLOCK_K] fp32 += x_t[:, None, :] * w[None] (BLOCK_M = next power of
      two >= m: each weight tile, in registers, serves every activation row), summed over BLOCK_K at the end.
      Block scales: a tile's rows lie in one 128-row scale block (BLOCK_N <= 128, tiles aligned), so the scale
      is a per-column vector scale[o // 128, k // 128] [BLOCK_K] multiplying w (the dequantized weight, rounded
      once in fp32: equal to dequantize-then-dot up to fp32 rounding).
  tensor cores: x padded to BLOCK_M = 16 rows (masked), a step's tile split into SUB sub-tiles [BLOCK_N, KS]
      (KS = 128 with block scales when BLOCK_K > 128, so a sub-tile never straddles a scale block), each
      converted to the dot dtype (bf16 / f16: exact for e4m3; f32 activations: an fp32 "ieee" dot);
      acc [16, BLOCK_N] += dot(x_t, w.T), with block scales dot(x_t, w.T) * scale[o // 128, k // 128] (each
      128-block's partial sum scaled); num_stages pipelines the loads (cp.async) through shared memory.
Per-channel scales multiply the finished sum: y[i, o] = scale[o] * sum_k x[i, k] * w[o, k].

Output out [SPLIT_K, m, out]: x's dtype when SPLIT_K == 1 (one launch, nothing after it), else fp32 partials
that fp8_gemv sums (as gguf_gemv/matmul.py's split kernels). Two fused forms at one split: fp8_gemv_parts_kernel
writes a packed q/k/v weight's three projections to three outputs (no slices after it), and GATE_UP pairs
each program's rows (half gate, half up) so its epilogue writes silu(gate) * up [m, out / 2]
(fp8_gemv_gate_up; the gated_mlp op).

Plain float weights (SCALED off; compiler/kernels/dense_gemv/dispatch.py): the same kernels read an unscaled bf16 / f16 / f32
matrix through the CUDA-core or tensor-core loops (the word loop is e4m3's), with the same epilogues.

W_BITCAST: the weight pointer holds uint8 bytes reinterpreted as e4m3 in the kernel (Triton's CPU interpreter,
tests/kernels/dense_gemv/test_fp8_gemv_interpret.py, has no float8 numpy buffers); on the GPU the fp8 array is
passed as it is.
All offsets are int32: out * in < 2**31 (checked).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from ember.compiler.kernels import activation
from ember.compiler.kernels.dense_gemv.config import Fp8GemvConfig, gate_up_fits, launch_plan, pick_fp8_config
from ember.compiler.kernels.dense_gemv.fp8 import Fp8Weight
from ember.compiler.kernels.dense_gemv.loops import program_sum
from ember.compiler.kernels.gguf_gemv.matmul import split_columns


@triton.jit
def _store_gate_up(acc, tile, i, i_ok, out_ptr, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] of a GATE_UP tile -> out[i, t H + [0, H)] = silu(gate) * up as HF computes it:
    gate and up rounded to the output dtype (as the unfused GEMV stores them), silu(gate) made in fp32 and
    rounded once (torch's silu on bf16), the product rounded once. XLA's fusion of the jnp activation rounds
    neither like this nor op by op: it agreed exactly with one rounding in ~2/3 of the outputs and with three in
    ~3/4 on the H200 (docs/results/h200_gpu_tests_4f6229b.json, h200_gpu_tests_29cba1d.json), within two ulps."""
    H: tl.constexpr = BLOCK_N // 2
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    gate, up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, H)), (0, 2, 1)))  # [BLOCK_M, H] each
    gate = gate.to(dtype).to(tl.float32)
    y = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up.to(dtype).to(tl.float32)
    cols = tile * H + tl.arange(0, H)
    tl.store(
        out_ptr + i[:, None] * (N // 2) + cols[None, :], y.to(dtype), mask=i_ok[:, None] & (cols < N // 2)[None, :]
    )


@triton.jit
def _store_parts(
    acc,
    tile,
    rows,
    row_ok,
    i,
    i_ok,
    out0_ptr,
    out1_ptr,
    out2_ptr,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    N1: tl.constexpr,
    N2: tl.constexpr,
):
    """acc [BLOCK_M, BLOCK_N] of row tile `tile` of a packed weight of three projections (rows [0, N1),
    [N1, N2), [N2, N); boundaries on tile edges) -> the projection's own output."""
    mask = i_ok[:, None] & row_ok[None, :]
    first = tile * BLOCK_N
    if first < N1:
        tl.store(out0_ptr + i[:, None] * N1 + rows[None, :], acc.to(out0_ptr.dtype.element_ty), mask=mask)
    elif first < N2:
        tl.store(out1_ptr + i[:, None] * (N2 - N1) + (rows - N1)[None, :], acc.to(out1_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out2_ptr + i[:, None] * (N - N2) + (rows - N2)[None, :], acc.to(out2_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fp8_gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    KS: tl.constexpr,
    K_PER_SPLIT: tl.constexpr,
    BLOCKED: tl.constexpr,
    USE_DOT: tl.constexpr,
    PREFETCH: tl.constexpr,
    STEP_REDUCE: tl.constexpr,
    WORDS: tl.constexpr,
    GATE_UP: tl.constexpr,
    IEEE: tl.constexpr,
    W_BITCAST: tl.constexpr,
    SCALED: tl.constexpr,
):
    acc, rows, row_ok, i, i_ok = program_sum(
        x_ptr,
        w_ptr,
        s_ptr,
        M,
        N,
        K,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        KS,
        K_PER_SPLIT,
        BLOCKED,
        USE_DOT,
        PREFETCH,
        STEP_REDUCE,
        WORDS,
        GATE_UP,
        IEEE,
        W_BITCAST,
        SCALED,
    )
    if GATE_UP:  # out [M, N / 2] = silu(gate) * up
        _store_gate_up(acc, tl.program_id(0), i, i_ok, out_ptr, N, BLOCK_M, BLOCK_N)
    else:
        out = out_ptr + (tl.program_id(1) * M + i[:, None]) * N + rows[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=i_ok[:, None] & row_ok[None, :])


@triton.jit
def fp8_gemv_parts_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out0_ptr,
    out1_ptr,
    out2_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    KS: tl.constexpr,
    K_PER_SPLIT: tl.constexpr,
    BLOCKED: tl.constexpr,
    USE_DOT: tl.constexpr,
    PREFETCH: tl.constexpr,
    STEP_REDUCE: tl.constexpr,
    WORDS: tl.constexpr,
    GATE_UP: tl.constexpr,
    IEEE: tl.constexpr,
    W_BITCAST: tl.constexpr,
    SCALED: tl.constexpr,
    N1: tl.constexpr,
    N2: tl.constexpr,
):
    """One launch for a packed weight of three projections (rows [0, N1), [N1, N2), [N2, N); both boundaries
    multiples of BLOCK_N, one K split): each program writes its rows into the projection's own output."""
    acc, rows, row_ok, i, i_ok = program_sum(
        x_ptr,
        w_ptr,
        s_ptr,
        M,
        N,
        K,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        KS,
        K_PER_SPLIT,
        BLOCKED,
        USE_DOT,
        PREFETCH,
        STEP_REDUCE,
        WORDS,
        GATE_UP,
        IEEE,
        W_BITCAST,
        SCALED,
    )
    _store_parts(acc, tl.program_id(0), rows, row_ok, i, i_ok, out0_ptr, out1_ptr, out2_ptr, N, BLOCK_N, N1, N2)


class GemvWeight(NamedTuple):
    """What the kernels read: values [out, in] (float8_e4m3fn with fp32 scales, or a plain bf16 / f16 / f32
    matrix with scale None) and whether the scales are 128 x 128 blocks."""

    values: jax.Array
    scale: jax.Array | None
    blocked: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(int(n) for n in self.values.shape)


def _fp8_with_config(x: jax.Array, w: Fp8Weight, config: Fp8GemvConfig | None) -> tuple[GemvWeight, Fp8GemvConfig]:
    """What the kernels read of an FP8 weight (fp32 scales) and the checked config for x (None: the FP8 table's)."""
    weight = GemvWeight(w.values, w.scale.astype(jnp.float32), w.blocked)
    return weight, checked_config(x, weight, config, pick_fp8_config)


def checked_config(x: jax.Array, w: GemvWeight, config: Fp8GemvConfig | None, pick) -> Fp8GemvConfig:
    """The config for x [m, in] against w (None: pick(m, out, in, blocked=...)), the word loop only for bf16 x
    and FP8 values."""
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x {x.shape} does not match a weight of shape {w.shape}")
    if x.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
        raise ValueError(f"activations must be bf16, f16 or f32, got {x.dtype}")
    m = x.shape[0]
    config = config or pick(m, *w.shape, blocked=w.blocked)
    if config.words and (x.dtype != jnp.bfloat16 or w.scale is None):  # words: four bf16 x per 8 bytes, e4m3 w
        config = dataclasses.replace(config, words=False, step_reduce=True)
    return config


def _launch(kernel, x: jax.Array, w: GemvWeight, config: Fp8GemvConfig, plan: dict, out_shape, **constants):
    """One native launch of `kernel` on x, w's values and scales (a placeholder when unscaled) with `plan`'s
    grid and constexprs."""
    from ember.compiler.kernels.triton.launch import triton_call  # GPU-only path: imported on use

    scale = jnp.zeros((1,), jnp.float32) if w.scale is None else w.scale
    return triton_call(
        x,
        w.values,
        scale,
        kernel=kernel,
        out_shape=out_shape,
        grid=plan["grid"],
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        IEEE=x.dtype == jnp.float32,
        W_BITCAST=False,
        SCALED=w.scale is not None,
        **constants,
        **plan["meta"],
    )


def gemv(x: jax.Array, w: GemvWeight, config: Fp8GemvConfig) -> jax.Array:
    """x [m, in] @ w.T (dequantized) -> [m, out] in x's dtype, fp32 accumulation: one launch, and the fp32
    partials' sum when the config splits K."""
    m = x.shape[0]
    out, inner = w.shape
    plan = launch_plan(m, out, inner, config, blocked=w.blocked)
    split_k = plan["split_k"]
    y = _launch(
        fp8_gemv_kernel,
        x,
        w,
        config,
        plan,
        jax.ShapeDtypeStruct((split_k, m, out), x.dtype if split_k == 1 else jnp.float32),
    )
    return y[0] if split_k == 1 else jnp.sum(y, axis=0).astype(x.dtype)


def gemv_gate_up(x: jax.Array, w: GemvWeight, config: Fp8GemvConfig) -> jax.Array:
    """silu(gate) * up of the packed gate/up projection x [m, in] @ w.T (w [2 ffn, in]: gate rows, then up
    rows) -> [m, ffn]: one launch where gate_up_fits, else the GEMV then activation.gated_act_packed."""
    if not gate_up_fits(w.shape[0], config, blocked=w.blocked):
        return activation.gated_act_packed(gemv(x, w, config), act="silu")
    m = x.shape[0]
    out, inner = w.shape
    plan = launch_plan(m, out, inner, config, blocked=False, gate_up=True)
    return _launch(fp8_gemv_kernel, x, w, config, plan, jax.ShapeDtypeStruct((m, out // 2), x.dtype))


def parts_fit(m: int, w: GemvWeight | Fp8Weight, sizes: tuple[int, ...], config: Fp8GemvConfig) -> bool:
    """Whether gemv_parts writes `sizes`' projections from one launch: three of them, one K split, and
    both boundaries on row-tile edges (else the packed product is sliced)."""
    if len(sizes) != 3 or sum(sizes) != w.shape[0]:
        return False
    plan = launch_plan(m, *w.shape, config, blocked=w.blocked)
    return plan["split_k"] == 1 and sizes[0] % config.block_n == 0 and sizes[1] % config.block_n == 0


def gemv_parts(x: jax.Array, w: GemvWeight, sizes: tuple[int, ...], config: Fp8GemvConfig) -> tuple[jax.Array, ...]:
    """x [m, in] @ w.T split into the projections of `sizes` (w packs them by rows): one output each,
    written by the kernel where parts_fit, else slices of the packed product."""
    m = x.shape[0]
    if not parts_fit(m, w, tuple(sizes), config):
        return split_columns(gemv(x, w, config), sizes)
    plan = launch_plan(m, *w.shape, config, blocked=w.blocked)
    return tuple(
        _launch(
            fp8_gemv_parts_kernel,
            x,
            w,
            config,
            plan,
            tuple(jax.ShapeDtypeStruct((m, size), x.dtype) for size in sizes),
            N1=sizes[0],
            N2=sizes[0] + sizes[1],
        )
    )


def fp8_gemv(x: jax.Array, w: Fp8Weight, config: Fp8GemvConfig | None = None) -> jax.Array:
    """x [m, in] (bf16, f16 or f32; m <= MAX_ROWS) @ dequant(w).T -> [m, out] in x's dtype, fp32 accumulation.
    Launches the Triton kernel (NVIDIA GPUs; lowered for the cuda platform anywhere)."""
    weight, config = _fp8_with_config(x, w, config)
    return gemv(x, weight, config)


def fp8_gemv_gate_up(x: jax.Array, w: Fp8Weight, config: Fp8GemvConfig | None = None) -> jax.Array:
    """silu(gate) * up of the packed gate/up projection x [m, in] @ dequant(w).T (w [2 ffn, in]: gate rows,
    then up rows) -> [m, ffn] in x's dtype: one launch where gate_up_fits (each program's rows half gate,
    half up: the product made in its epilogue), else the GEMV then activation.gated_act_packed."""
    weight, config = _fp8_with_config(x, w, config)
    return gemv_gate_up(x, weight, config)


def fp8_gemv_parts(
    x: jax.Array, w: Fp8Weight, sizes: tuple[int, ...], config: Fp8GemvConfig | None = None
) -> tuple[jax.Array, ...]:
    """x [m, in] @ dequant(w).T split into the projections of `sizes` (w packs them by rows): one output each,
    written by the kernel where parts_fit, else slices of the packed product."""
    weight, config = _fp8_with_config(x, w, config)
    return gemv_parts(x, weight, tuple(sizes), config)
