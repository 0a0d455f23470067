"""RMSNorm (with the residual add before it) made in the prologue of a persistent FP8 decode GEMV.

Why: at batch 1 an 8B FP8 step ran 63 norm launches of ~2 us each (0.13 ms of ~2.7, a single program per
row whose time is load latency and launch, tools/results/h200_plan_alone_fp8_4f6229b.json). The GEMV that
reads the normed row can make it itself: the row is 4 K bytes of bf16, its weights K x out bytes of fp8.

Persistent programs. A GEMV program that normalized the row itself would read the residual, the
projection's output and the norm weight (3 x 2K bytes) for every BLOCK_N x K weight bytes: three times the
L2 traffic of x alone, at ~7000 programs for a gate/up projection. So the grid is a few programs per SM;
each normalizes the row once, keeps it in registers (the whole K: K / 4 words over the program's threads,
laid out like the weight tile) and walks row tiles pid, pid + P, ... of the weight, the next tile's words
loaded before this tile's math (a register double buffer). Program 0 also stores the sum (the new residual
stream).

Numerics: the sum is rounded as add_rms_norm_kernel rounds it, the statistics are fp32 and the normed row
h = s * rsqrt(mean(s^2) + eps) * w is rounded to bf16 before it meets the weights, as the unfused norm
stores it; only the order of the sum of squares differs (so h may differ in its last bit, rarely). Then
each row tile's dot is the word loop's (fp8_gemv_words.py) over the whole K and the epilogue is the
GEMV's: per-channel scale, then one output, three (q/k/v parts) or silu(gate) * up (GATE_UP).

Limits (fits): one activation row, bf16, per-channel scales, K a multiple of 4 and at most MAX_K (the
whole row's words held per thread: MAX_K / 4 / (32 num_warps) words of the row and of each tile).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from ..env_config import overridden
from .fp8 import Fp8Weight
from .fp8_gemv import store_gate_up, store_parts, tile_rows
from .fp8_gemv_words import _bf16_quarters, _word_values

MAX_K = 8192
FORMS = ("plain", "parts", "gate_up")


@dataclasses.dataclass(frozen=True)
class Fp8NormGemvConfig:
    block_n: int = 4            # weight rows per tile (power of two; gate_up: half gate, half up)
    programs_per_sm: int = 4    # persistent programs: this many per SM
    num_warps: int = 4
    num_sms: int = 132          # the H200's
    early_row: bool = False     # the row's loads (x, y, g) issued before the first tile's


def default_config() -> Fp8NormGemvConfig:
    """Fp8NormGemvConfig(), with EMBER_FP8_NORM_GEMV ("block_n=8/programs_per_sm=2", read at trace time)."""
    return overridden(Fp8NormGemvConfig(), "EMBER_FP8_NORM_GEMV")


@triton.jit
def _bf16_bits(v):
    """f32 values exact in bf16 -> their bf16 bits as u64 (the high half of the f32 bits)."""
    return (v.to(tl.uint32, bitcast=True) >> 16).to(tl.uint64)


@triton.jit
def _row_quads(x_ptr, y_ptr, g_ptr, kw, kw_ok, ADD: tl.constexpr):
    """The loads of the prologue: x's, y's (ADD) and g's words kw [1, 1, KWP] as u64 quads of four bf16."""
    quads = tl.pointer_type(tl.uint64)
    xq = tl.load(x_ptr.to(quads) + kw, mask=kw_ok, other=0)
    yq = tl.load(y_ptr.to(quads) + kw, mask=kw_ok & ADD, other=0)
    gq = tl.load(g_ptr.to(quads) + kw, mask=kw_ok, other=0)
    return xq, yq, gq


@triton.jit
def _normed_row(xq, yq, gq, sum_ptr, kw, kw_ok, K: tl.constexpr, EPS: tl.constexpr, ADD: tl.constexpr, WRITE_SUM):
    """_row_quads' words -> h0..h3 f32 [1, 1, KWP]: element 4w + j of rms_norm(x + y) * g, rounded to bf16
    (0 past K). ADD: s = x + y rounded to bf16 (stored by the program where WRITE_SUM), else s = x."""
    s0, s1, s2, s3 = _bf16_quarters(xq)
    if ADD:
        y0, y1, y2, y3 = _bf16_quarters(yq)
        s0 = (s0 + y0).to(tl.bfloat16).to(tl.float32)
        s1 = (s1 + y1).to(tl.bfloat16).to(tl.float32)
        s2 = (s2 + y2).to(tl.bfloat16).to(tl.float32)
        s3 = (s3 + y3).to(tl.bfloat16).to(tl.float32)
        packed = _bf16_bits(s0) | (_bf16_bits(s1) << 16) | (_bf16_bits(s2) << 32) | (_bf16_bits(s3) << 48)
        tl.store(sum_ptr.to(tl.pointer_type(tl.uint64)) + kw, packed, mask=kw_ok & WRITE_SUM)
    g0, g1, g2, g3 = _bf16_quarters(gq)
    inv = 1.0 / tl.sqrt(tl.sum(s0 * s0 + s1 * s1 + s2 * s2 + s3 * s3) / K + EPS)
    h0 = (s0 * inv * g0).to(tl.bfloat16).to(tl.float32)
    h1 = (s1 * inv * g1).to(tl.bfloat16).to(tl.float32)
    h2 = (s2 * inv * g2).to(tl.bfloat16).to(tl.float32)
    h3 = (s3 * inv * g3).to(tl.bfloat16).to(tl.float32)
    return h0, h1, h2, h3


@triton.jit
def _tile_words(words_ptr, tile, kw, kw_ok, TILES: tl.constexpr, N: tl.constexpr, KW: tl.constexpr,
                BLOCK_N: tl.constexpr, GATE_UP: tl.constexpr):
    """Row tile `tile`'s u32 words [1, BLOCK_N, KWP] (0 where masked or tile >= TILES)."""
    rows, row_ok = tile_rows(tile, N, BLOCK_N, GATE_UP)
    ok = row_ok[None, :, None] & kw_ok & (tile < TILES)
    return tl.load(words_ptr + rows[None, :, None] * KW + kw, mask=ok, other=0)


@triton.jit
def _tile_scales(s_ptr, tile, TILES: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr, GATE_UP: tl.constexpr):
    """Row tile `tile`'s per-channel scales [BLOCK_N] (0 where masked or tile >= TILES)."""
    rows, row_ok = tile_rows(tile, N, BLOCK_N, GATE_UP)
    return tl.load(s_ptr + rows, mask=row_ok & (tile < TILES), other=0.0)


@triton.jit
def fp8_norm_gemv_kernel(x_ptr, y_ptr, g_ptr, w_ptr, s_ptr, sum_ptr, out0_ptr, out1_ptr, out2_ptr,
                         N: tl.constexpr, K: tl.constexpr, KWP: tl.constexpr, BLOCK_N: tl.constexpr,
                         TILES: tl.constexpr, EPS: tl.constexpr, ADD: tl.constexpr, FORM: tl.constexpr,
                         N1: tl.constexpr, N2: tl.constexpr, ASM: tl.constexpr, NORM: tl.constexpr,
                         EARLY_ROW: tl.constexpr):
    """x, y [1, K] bf16 (y unused unless ADD), g [K] bf16, w [N, K] e4m3 bytes, s [N] f32 per-channel scales
    -> sum [1, K] (ADD) and FORM 0: out0 [1, N]; 1: out0/out1/out2 (rows [0, N1), [N1, N2), [N2, N));
    2: out0 [1, N / 2] = silu(gate) * up. Grid (P,): program p takes row tiles p, p + P, ... < TILES."""
    KW: tl.constexpr = K // 4
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    lane = tl.arange(0, KWP)[None, None, :]
    kw = (lane // 2) * 2 + lane % 2  # contiguity 2: 8-byte word pairs, as the word loop
    kw_ok = kw < KW
    words_ptr = w_ptr.to(tl.pointer_type(tl.uint32))
    GATE_UP: tl.constexpr = FORM == 2
    # the next tile's words and scales are loaded a tile ahead: a load waited on inside the walk would stall
    # every tile of the program by a memory round trip. EARLY_ROW: the row's loads go out before the first
    # tile's (their answers are not queued behind 512 programs' tiles)
    if EARLY_ROW:
        xq, yq, gq = _row_quads(x_ptr, y_ptr, g_ptr, kw, kw_ok, ADD)
    nxt = _tile_words(words_ptr, pid, kw, kw_ok, TILES, N, KW, BLOCK_N, GATE_UP)
    nxt_scale = _tile_scales(s_ptr, pid, TILES, N, BLOCK_N, GATE_UP)
    if not EARLY_ROW:
        xq, yq, gq = _row_quads(x_ptr, y_ptr, g_ptr, kw, kw_ok, ADD)
    if NORM:
        h0, h1, h2, h3 = _normed_row(xq, yq, gq, sum_ptr, kw, kw_ok, K, EPS, ADD, pid == 0)
    else:  # x is the normed row already (tools/bench_fp8_norm_gemv.py: the persistent walk alone)
        h0, h1, h2, h3 = _bf16_quarters(xq)
    i = tl.arange(0, 1)
    i_ok = i < 1
    for tile in range(pid, TILES, step):
        words = nxt
        scale = nxt_scale
        nxt = _tile_words(words_ptr, tile + step, kw, kw_ok, TILES, N, KW, BLOCK_N, GATE_UP)
        nxt_scale = _tile_scales(s_ptr, tile + step, TILES, N, BLOCK_N, GATE_UP)
        rows, row_ok = tile_rows(tile, N, BLOCK_N, GATE_UP)
        v0, v1, v2, v3 = _word_values(words, ASM)                   # [1, BLOCK_N, KWP] f32 each
        acc = tl.sum(v0 * h0 + v1 * h1 + v2 * h2 + v3 * h3, axis=2) * scale[None, :]   # [1, BLOCK_N]
        if FORM == 2:
            store_gate_up(acc, tile, i, i_ok, out0_ptr, N, 1, BLOCK_N)
        elif FORM == 1:
            store_parts(acc, tile, rows, row_ok, i, i_ok, out0_ptr, out1_ptr, out2_ptr, N, BLOCK_N, N1, N2)
        else:
            tl.store(out0_ptr + rows[None, :], acc.to(out0_ptr.dtype.element_ty), mask=row_ok[None, :])


def fits(x: jax.Array, w, form: str, sizes: tuple[int, ...] = (),
         config: Fp8NormGemvConfig | None = None) -> bool:
    """Whether fp8_norm_gemv takes x [m, K] and w: an Fp8Weight with per-channel scales, one bf16 row,
    K % 4 == 0 and K <= MAX_K; gate_up: an even row count; parts: three projections on row-tile edges."""
    config = config or default_config()
    if not (isinstance(w, Fp8Weight) and not w.blocked and x.ndim == 2 and x.shape[0] == 1
            and x.dtype == jnp.bfloat16 and x.shape[1] == w.shape[1] and w.shape[1] % 4 == 0
            and w.shape[1] <= MAX_K and w.shape[0] * w.shape[1] < 2**31):
        return False
    if form == "gate_up":
        return w.shape[0] % 2 == 0 and config.block_n >= 2
    if form == "parts":
        return (len(sizes) == 3 and sum(sizes) == w.shape[0] and sizes[0] % config.block_n == 0
                and sizes[1] % config.block_n == 0)
    return form == "plain"


def launch_plan(out: int, inner: int, form: str, config: Fp8NormGemvConfig, *, add: bool,
                sizes: tuple[int, ...] = ()) -> dict:
    """Grid, warps and constexprs of one call (pure; eps is the caller's)."""
    bn = config.block_n
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if bn < 1 or bn & (bn - 1) or (form == "gate_up" and bn < 2):
        raise ValueError(f"block_n must be a power of two (>= 2 for gate_up), got {bn}")
    if inner % 4 or inner > MAX_K:
        raise ValueError(f"K must be a multiple of 4 and <= {MAX_K}, got {inner}")
    tiles = -(-(out // 2) // (bn // 2)) if form == "gate_up" else -(-out // bn)
    # as many tiles per program as the programs allow, then the fewest programs that walk them all: every
    # program takes the same count (the last few one fewer), no last round where most of them idle
    per_program = -(-tiles // max(1, config.num_sms * config.programs_per_sm))
    programs = -(-tiles // per_program)
    n1 = sizes[0] if form == "parts" else 0
    n2 = sizes[0] + sizes[1] if form == "parts" else 0
    meta = dict(N=out, K=inner, KWP=1 << (inner // 4 - 1).bit_length(), BLOCK_N=bn, TILES=tiles, ADD=add,
                FORM=FORMS.index(form), N1=n1, N2=n2, EARLY_ROW=config.early_row)
    return {"grid": (programs, 1, 1), "num_warps": config.num_warps, "meta": meta}


def fp8_norm_gemv(x, y, norm_weight, w: Fp8Weight, *, eps: float, form: str, sizes: tuple[int, ...] = (),
                  config: Fp8NormGemvConfig | None = None) -> tuple:
    """(s, outputs) with s = x + y (x where y is None) and outputs the projection of rms_norm(s) * norm_weight
    by w: (y,) for "plain", three for "parts" (sizes), (silu(gate) * up,) for "gate_up". One launch; the
    caller checks fits first."""
    from ..triton_launch import triton_call  # GPU-only path: imported on use

    config = config or default_config()
    out, inner = w.shape
    plan = launch_plan(out, inner, form, config, add=y is not None, sizes=tuple(sizes))
    shapes = {"plain": (out,), "parts": tuple(sizes), "gate_up": (out // 2,)}[form]
    outputs = tuple(jax.ShapeDtypeStruct((1, n), x.dtype) for n in shapes)
    unused = jax.ShapeDtypeStruct((1, 1), x.dtype)  # output pointers the form does not write
    pads = (unused,) * (3 - len(outputs))
    sum_shape = (jax.ShapeDtypeStruct(x.shape, x.dtype) if y is not None else unused,)
    results = triton_call(
        x, x if y is None else y, norm_weight.astype(x.dtype), w.values, w.scale.astype(jnp.float32),
        kernel=fp8_norm_gemv_kernel, out_shape=sum_shape + outputs + pads, grid=plan["grid"],
        num_warps=plan["num_warps"], num_stages=1, EPS=float(eps), ASM=True, NORM=True, **plan["meta"])
    return (results[0] if y is not None else x), tuple(results[1:1 + len(outputs)])
