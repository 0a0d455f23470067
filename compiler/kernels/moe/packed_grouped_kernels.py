"""Mixture-of-Experts for steps of many rows over expert stacks kept packed in GGUF formats (packed.py's layout):
the twins of grouped_kernels.py's two kernels (the same tile map, grids, outputs and semantics), reading only the
packed blocks of the expert a tile needs. Each K tile of the expert's weights is decoded in registers by the
quantized GEMM's tile decoders (gguf_gemm/kernel.py `weight_tile`), rounded once to the activation dtype and fed
to `tl.dot` (fp32 activations: an "ieee" dot on the fp32 tiles), as gguf_gemm's quant_gemm_kernel does.

- moe_packed_grouped_gate_up_kernel, grid (tiles, cdiv(F, BN)): x's rows of a tile's pairs against the tile's
  expert's gate and up rows (gate and up may differ in format) -> h_sorted [M, F] = silu(gate) * up, fp32.
- moe_packed_grouped_down_kernel, grid (tiles, cdiv(D, BN)): h_sorted's rows (rounded to the activation dtype,
  as the float kernel rounds them to its weights' dtype) against the expert's down rows, times each pair's
  routing weight -> y_sorted [M, D], fp32; the caller combines a row's K terms in j order.

One expert's planes are the dense layout of its [out, in] matrix at offset expert * (plane size / E) in each plane
(packed.py): a kernel offsets its 4 plane pointers (gguf_gemm.PLANES order) by the expert times each plane's
per-expert element count (constexprs S0..S3, from `stack_args`), then decodes tiles as for a 2-D matrix.
Interpreter and sm_90 lowering tested; not yet run on a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemm.gemm import PLANES, GemmConfig, gemm_plan, plane_args
from ember.compiler.kernels.gguf_gemm.kernel import weight_tile

from . import grouped_kernels
from .grouped_kernels import _tile_pairs

# the formats these kernels decode (gguf_gemm's tile decoders)
FORMATS = tuple(PLANES)
# the activation dtype's name -> the kernels' DOT constexpr
DOT_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@triton.jit
def _expert_planes(p0, p1, p2, p3, expert, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, S3: tl.constexpr):
    """The 4 plane pointers of one expert's [out, in] matrix (expert int64: whole stacks may pass 2**31 bytes)."""
    return p0 + expert * S0, p1 + expert * S1, p2 + expert * S2, p3 + expert * S3


@triton.jit
def _dot(a, w, acc, DOT: tl.constexpr):
    """acc [BM, BN] + a [BM, BK] @ w [BN, BK].T, both rounded once to the activation dtype DOT ("fp32": an ieee
    dot of fp32 values, as gguf_gemm's kernel does for fp32 activations)."""
    if DOT == "fp32":
        acc = tl.dot(a.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
    elif DOT == "fp16":
        acc = tl.dot(a.to(tl.float16), tl.trans(w.to(tl.float16)), acc)
    else:
        acc = tl.dot(a.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)), acc)
    return acc


@triton.jit
def moe_packed_grouped_gate_up_kernel(
    x_ptr,  # [rows, D]
    token_ptr,  # [M] int32: the token of each sorted pair
    tile_expert_ptr,  # [T] int32
    tile_start_ptr,  # [T] int32: first sorted pair of the tile
    tile_size_ptr,  # [T] int32: pairs in it (0: an unused tile)
    g0, g1, g2, g3,  # gate [E, F, D] planes
    u0, u1, u2, u3,  # up [E, F, D] planes
    h_ptr,  # [M, F] fp32
    D: tl.constexpr, F: tl.constexpr, E: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr,
    FMT_G: tl.constexpr, FMT_U: tl.constexpr, DOT: tl.constexpr,
    GS0: tl.constexpr, GS1: tl.constexpr, GS2: tl.constexpr, GS3: tl.constexpr,  # gate planes' elements per expert
    US0: tl.constexpr, US1: tl.constexpr, US2: tl.constexpr, US3: tl.constexpr,  # up's
):  # fmt: skip
    BK: tl.constexpr = SUB * 32  # D % BK == 0 (launch_plan): no K masks
    expert, start, r, ok_r, n, ok_n = _tile_pairs(tile_expert_ptr, tile_start_ptr, tile_size_ptr, F, E, BM, BN)
    token = tl.load(token_ptr + start + r, mask=ok_r, other=0)  # rows past the tile read token 0, store nothing
    rows = tl.minimum(n, F - 1)  # clamped: the tile decoders' loads are unmasked
    g0, g1, g2, g3 = _expert_planes(g0, g1, g2, g3, expert, GS0, GS1, GS2, GS3)
    u0, u1, u2, u3 = _expert_planes(u0, u1, u2, u3, expert, US0, US1, US2, US3)
    cols = tl.arange(0, BK)
    acc_g = tl.zeros([BM, BN], tl.float32)
    acc_u = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, D, BK):
        x = tl.load(x_ptr + token[:, None] * D + k0 + cols[None, :])  # [BM, BK]
        acc_g = _dot(x, weight_tile(g0, g1, g2, g3, k0, rows, F, SUB, FMT_G), acc_g, DOT)  # tile [BN, BK] fp32
        acc_u = _dot(x, weight_tile(u0, u1, u2, u3, k0, rows, F, SUB, FMT_U), acc_u, DOT)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + (start + r)[:, None] * F + n[None, :], h, mask=ok_r[:, None] & ok_n[None, :])


@triton.jit
def moe_packed_grouped_down_kernel(
    h_ptr,  # [M, F] fp32
    weight_ptr,  # [M] fp32: the routing weight of each sorted pair
    tile_expert_ptr,
    tile_start_ptr,
    tile_size_ptr,
    p0, p1, p2, p3,  # down [E, D, F] planes
    y_ptr,  # [M, D] fp32
    D: tl.constexpr, F: tl.constexpr, E: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SUB: tl.constexpr,
    FMT: tl.constexpr, DOT: tl.constexpr,
    S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, S3: tl.constexpr,  # planes' elements per expert
):  # fmt: skip
    BK: tl.constexpr = SUB * 32  # F % BK == 0
    expert, start, r, ok_r, n, ok_n = _tile_pairs(tile_expert_ptr, tile_start_ptr, tile_size_ptr, D, E, BM, BN)
    rows = tl.minimum(n, D - 1)
    p0, p1, p2, p3 = _expert_planes(p0, p1, p2, p3, expert, S0, S1, S2, S3)
    cols = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, F, BK):
        h = tl.load(h_ptr + (start + r)[:, None] * F + k0 + cols[None, :], mask=ok_r[:, None], other=0.0)
        acc = _dot(h, weight_tile(p0, p1, p2, p3, k0, rows, D, SUB, FMT), acc, DOT)
    weight = tl.load(weight_ptr + start + r, mask=ok_r, other=0.0)
    tl.store(y_ptr + (start + r)[:, None] * D + n[None, :], acc * weight[:, None], mask=ok_r[:, None] & ok_n[None, :])


def k_tile_groups(fmts: tuple[str, ...], inner: int, out: int, max_sub: int) -> int:
    """SUB (32-element groups per K tile) for rows of length `inner` in every format of `fmts`: gemm_plan's
    choice (a power of two dividing inner / 32, a K-quant tile inside its super-block), which also checks the
    format and the row length."""
    config = GemmConfig(block_m=16, block_n=16, sub=max_sub)
    return min(gemm_plan(fmt, 1, out, inner, config)["meta"]["SUB"] for fmt in fmts)


def launch_plan(
    rows: int, d: int, f: int, experts: int, top_k: int, formats: tuple[str, str, str], dtype: str,
    strides: tuple[tuple[int, ...], ...], *, max_sub: int = 2,
) -> dict:  # fmt: skip
    """grouped_kernels.launch_plan's tiles, grids and warps with the packed kernels' constants: formats and
    strides (stack_args) of (gate, up, down), dtype the activations' name. K tiles of up to max_sub * 32 = 64
    elements, the float kernels' BK (two decoded [64, BK] fp32 tiles live at once in gate/up; not measured)."""
    plan = grouped_kernels.launch_plan(rows, d, f, experts, top_k)
    gate, up, down = formats
    common = dict(D=d, F=f, E=experts, BM=plan["block_m"], BN=plan["gate_up"]["meta"]["BN"], DOT=DOT_TYPES[dtype])
    named = lambda prefix, values: {f"{prefix}{i}": v for i, v in enumerate(values)}  # noqa: E731
    gate_up_meta = dict(common, SUB=k_tile_groups((gate, up), d, f, max_sub), FMT_G=gate, FMT_U=up)
    gate_up_meta |= named("GS", strides[0]) | named("US", strides[1])
    down_meta = dict(common, SUB=k_tile_groups((down,), f, d, max_sub), FMT=down, **named("S", strides[2]))
    return {
        "block_m": plan["block_m"],
        "gate_up": dict(plan["gate_up"], meta=gate_up_meta),
        "down": dict(plan["down"], meta=down_meta),
    }


def stack_args(w) -> tuple[tuple, tuple[int, ...]]:
    """A packed [E, out, in] stack -> (its 4 planes in the kernels' pointer order, each one's elements per expert)."""
    planes = plane_args(w)
    return planes, tuple(p.size // w.shape[0] for p in planes)
