"""The FP8 GEMV's word loop (dense_gemv/kernel.py, config.words): the CUDA-core sum over 4-byte words of e4m3 weights.

Why words: Triton's own fp8 -> f32 conversion unpacks and repacks every byte (~7 SASS instructions per weight
at 8 x 1024 tiles, PRMT-bound: the byte loop tops out near 2.7 TB/s on the H200). Here one u32 of four e4m3
bytes becomes four f32 through two cvt.rn.f16x2.e4m3x2 (one per byte pair) and four f16 -> f32 converts
(inline PTX), ~2 instructions per weight plus its FMA; x's matching four bf16 come in one 8-byte load.

Layout. A step's tile is [1, BLOCK_N, W = BLOCK_K / 4] u32 words (byte j of word w = column 4w + j; needs
K % 4 == 0), loaded in 8-byte pairs; x's columns come as [BLOCK_M, 1, W] u64 "quads" (four bf16) at the same
word index. Every operand is 3-D from its load on and the pair structure gives the tile and the quads the same
per-thread vector width, so tile, x and acc [BLOCK_M, BLOCK_N, W] share one register layout (no shuffles
through shared memory); the next step's tile is loaded before this step's math (a register double buffer).

Activations must be bf16 (fp8_gemv falls back to the byte loop for others).
"""

from __future__ import annotations

import triton
import triton.language as tl

_E4M3_WORD_TO_F32: tl.constexpr = tl.constexpr("""{
.reg .b16 lo, hi, h0, h1, h2, h3;
.reg .b32 p01, p23;
mov.b32 {lo, hi}, $4;
cvt.rn.f16x2.e4m3x2 p01, lo;
cvt.rn.f16x2.e4m3x2 p23, hi;
mov.b32 {h0, h1}, p01;
mov.b32 {h2, h3}, p23;
cvt.f32.f16 $0, h0;
cvt.f32.f16 $1, h1;
cvt.f32.f16 $2, h2;
cvt.f32.f16 $3, h3;
}""")


@triton.jit
def _word_values(words, ASM: tl.constexpr):
    """u32 words (any shape) -> the four e4m3 values of each as f32 (byte 0 first). ASM: the PTX above;
    otherwise bit operations (Triton's CPU interpreter has no inline assembly)."""
    if ASM:
        v0, v1, v2, v3 = tl.inline_asm_elementwise(
            _E4M3_WORD_TO_F32,
            "=r,=r,=r,=r,r",
            [words],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    else:
        v0 = (words & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v1 = ((words >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v2 = ((words >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        v3 = (words >> 24).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return v0, v1, v2, v3


@triton.jit
def _bf16_quarters(quads):
    """u64 quads (four bf16 each) -> four f32 (bf16 -> f32 is a 16-bit shift)."""
    x0 = ((quads & 0xFFFF) << 16).to(tl.uint32).to(tl.float32, bitcast=True)
    x1 = (((quads >> 16) & 0xFFFF) << 16).to(tl.uint32).to(tl.float32, bitcast=True)
    x2 = (((quads >> 32) & 0xFFFF) << 16).to(tl.uint32).to(tl.float32, bitcast=True)
    x3 = ((quads >> 48) << 16).to(tl.uint32).to(tl.float32, bitcast=True)
    return x0, x1, x2, x3


@triton.jit
def _x_quads(x_ptr, i3, i_ok3, kw, kw_ok, scale, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKED: tl.constexpr):
    """x's columns 4w + j (j = 0..3) of the words kw [1, 1, W] as four f32 [BLOCK_M, BLOCK_N, W] (broadcast
    over the tile's rows, so the load takes the tile's layout), times the block scale."""
    quads = tl.load(x_ptr.to(tl.pointer_type(tl.uint64)) + i3 * (K // 4) + kw, mask=i_ok3 & kw_ok, other=0)
    x0, x1, x2, x3 = _bf16_quarters(tl.broadcast_to(quads, (i3.shape[0], BLOCK_N, kw.shape[2])))
    if BLOCKED:
        x0, x1, x2, x3 = x0 * scale, x1 * scale, x2 * scale, x3 * scale
    return x0, x1, x2, x3


@triton.jit
def _word_tile(words_ptr, r3, rok3, kw, ok, KW: tl.constexpr):
    """u32 words [1, BLOCK_N, W] at word columns kw (masked to 0 past KW, past `out`, or where not ok)."""
    return tl.load(words_ptr + r3 * KW + kw, mask=rok3 & (kw < KW) & ok, other=0)


@triton.jit
def word_sum(
    x_ptr,
    w_ptr,
    s_ptr,
    rows,
    row_ok,
    i,
    i_ok,
    k_start,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCKED: tl.constexpr,
    PREFETCH: tl.constexpr,
    ASM: tl.constexpr,
):
    """sum_k x[i, k] * w[o, k] over the program's range -> [BLOCK_M, BLOCK_N] fp32 (block scales applied;
    a tile's rows share one scale row, so the scale multiplies x's columns)."""
    KW: tl.constexpr = K // 4
    KB: tl.constexpr = (K + 127) // 128
    W: tl.constexpr = BLOCK_K // 4
    words_ptr = w_ptr.to(tl.pointer_type(tl.uint32))
    r3 = rows[None, :, None]
    rok3 = row_ok[None, :, None]
    i3 = i[:, None, None]
    i_ok3 = i_ok[:, None, None]
    lane = tl.arange(0, W)[None, None, :]
    lane = (lane // 2) * 2 + lane % 2  # contiguity 2: 8-byte word pairs, the quads' vector width
    kw0 = k_start // 4 + lane
    acc = tl.zeros((BLOCK_M, BLOCK_N, W), tl.float32)
    nxt = _word_tile(words_ptr, r3, rok3, kw0, True, KW)
    for step in range(STEPS):
        kw = kw0 + step * W  # [1, 1, W] word columns
        kw_ok = kw < KW
        if PREFETCH:  # the next step's tile is in flight during this step's math (masked off after the last)
            words = nxt
            nxt = _word_tile(words_ptr, r3, rok3, kw + W, step + 1 < STEPS, KW)
        else:
            words = _word_tile(words_ptr, r3, rok3, kw, True, KW)
        v0, v1, v2, v3 = _word_values(words, ASM)  # [1, BLOCK_N, W] f32 each
        scale = 0.0
        if BLOCKED:
            srow = (tl.program_id(0) * BLOCK_N) // 128
            scale = tl.load(s_ptr + srow * KB + (4 * kw) // 128, mask=kw_ok, other=0.0)
        x0, x1, x2, x3 = _x_quads(x_ptr, i3, i_ok3, kw, kw_ok, scale, K, BLOCK_N, BLOCKED)
        acc = acc + v0 * x0
        acc = acc + v1 * x1
        acc = acc + v2 * x2
        acc = acc + v3 * x3
    return tl.sum(acc, axis=2)
