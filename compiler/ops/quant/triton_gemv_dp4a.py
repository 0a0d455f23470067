"""Q4_K GEMV on int8 activations (act_quant.py): integer dot products with `dp4a`, the "dp4a" variant.

The frame is the rows kernel's (triton_gemv.py: grid (cdiv(out, BLOCK_N), SPLIT_K), a program walks its
split's super-blocks S at a time, one 4-D load [S, BLOCK_N, 8, 4] of code words with the next step's
loads issued first, no masks when EXACT), and groups of R activation rows (R <= matmul.DP4A_MAX_ROWS = 8,
one accumulator each) side by side on grid axis 0: every row of a group reuses the codes the program decoded.

Per code word (8 weights of one sub-block of one row): lo = word & 0x0F0F0F0F and
hi = (word >> 4) & 0x0F0F0F0F are 4 unsigned bytes each (act_quant.py: elements q, q+8, q+16, q+24 and
q+4, ..., q+28), and per activation row two dp4a against the matching int8 words add the 8 products into
an int32. The 4 words of a sub-block (one thread's 16-byte vector) sum in registers; per sub-block and row
acc += (d sc) * (dx * float(sum)) - (dmin m) * sx. That is ~3 + 2 R instructions per 8 weights where the
float kernel spends ~8 + 8 R.

Precision: the integer sums are exact; what differs from the float GEMV is only x's int8 rounding
(|error| <= dx / 2 per element, dx = max |x| / 127 over its block of 32), as in llama.cpp's decode.
ASM=False (Triton's CPU interpreter has no inline PTX) computes dp4a with shifts and multiplies.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.ops.quant.triton_gemv import q4_k_load, q4_k_sub_scales
from ember.compiler.ops.quant.triton_gemv_common import load_where


@triton.jit
def dp4a(a, b, c, ASM: tl.constexpr):
    """c + sum over bytes k of a_k * b_k, a's bytes unsigned and b's signed (int32 results)."""
    if ASM:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        a32 = a.to(tl.int32, bitcast=True)
        total = c
        for k in tl.static_range(4):
            total += ((a32 >> (8 * k)) & 255) * ((b << (24 - 8 * k)) >> 24)
        return total


@triton.jit
def _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, row, blk4, q4, ok_u4, K: tl.constexpr,
               MASKED: tl.constexpr, ASM: tl.constexpr):
    """Activation row `row`'s contribution for the step's sub-blocks: float32 [S, BLOCK_N, 8, 1].
    lo/hi [S, BLOCK_N, 8, 4] code bytes; blk4 [S, 1, 8, 1] activation block of each sub-block."""
    words = qa_ptr + row * (K // 4) + blk4 * 8 + q4                       # [S, 1, 8, 4]
    a_lo = load_where(words, ok_u4, MASKED)
    a_hi = load_where(words + 4, ok_u4, MASKED)
    scales = da_ptr + (row * (K // 32) + blk4) * 2                       # [S, 1, 8, 1]
    dx = load_where(scales, ok_u4, MASKED)
    sx = load_where(scales + 1, ok_u4, MASKED)
    dot = dp4a(hi, a_hi, dp4a(lo, a_lo, 0, ASM), ASM)
    total = tl.sum(dot, axis=3, keep_dims=True).to(tl.float32)          # exact: < 2**16 in magnitude
    return scale * (dx * total) - minimum * sx


@triton.jit
def _store(out_ptr, acc, row, pid_k, rows, row_ok, M_PAD: tl.constexpr, N: tl.constexpr):
    y = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=0)               # [BLOCK_N]
    tl.store(out_ptr + (pid_k * M_PAD + row) * N + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def q4_k_dp4a_kernel(qa_ptr, da_ptr, qs_ptr, scales_ptr, d_ptr, dmin_ptr, out_ptr,
                     M_PAD: tl.constexpr, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr,
                     BLOCK_N: tl.constexpr, S: tl.constexpr, UNITS_PER_SPLIT: tl.constexpr,
                     PREFETCH: tl.constexpr, EXACT: tl.constexpr, ASM: tl.constexpr):
    """qa int32 [M_PAD, K/4], da float32 [M_PAD, K/32, 2] (act_quant.py) -> out [SPLIT_K, M_PAD, N].
    Grid axis 0 = row tile * GROUPS + g: the programs of one weight tile are launched together, so the
    row groups after the first read the tile from L2, not HBM. Program g takes rows g R .. g R + R - 1."""
    GROUPS: tl.constexpr = M_PAD // R
    rows = (tl.program_id(0) // GROUPS) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    r4 = rows[None, :, None, None]
    row_ok4 = row_ok[None, :, None, None]
    pid_k = tl.program_id(1)
    m0 = (tl.program_id(0) % GROUPS) * R
    start = pid_k * UNITS_PER_SPLIT
    stop = tl.minimum(start + UNITS_PER_SPLIT, K // 256)
    u0 = start + tl.arange(0, S)[:, None, None, None]
    n4 = tl.arange(0, 8)[None, None, :, None]
    q4 = tl.arange(0, 4)[None, None, None, :]
    w4 = n4 * 4 + q4
    acc0 = tl.zeros((S, BLOCK_N, 8, 1), tl.float32)
    acc1 = tl.zeros((S, BLOCK_N, 8, 1), tl.float32)
    acc2 = tl.zeros((S, BLOCK_N, 8, 1), tl.float32)
    acc3 = tl.zeros((S, BLOCK_N, 8, 1), tl.float32)
    acc4 = tl.zeros((S, BLOCK_N, 8, 1), tl.float32)
    acc5 = tl.zeros((S, BLOCK_N, 8, 1), tl.float32)
    acc6 = tl.zeros((S, BLOCK_N, 8, 1), tl.float32)
    acc7 = tl.zeros((S, BLOCK_N, 8, 1), tl.float32)
    if EXACT:
        nsteps = (stop - start) // S
    else:
        nsteps = (UNITS_PER_SPLIT + S - 1) // S
    masked: tl.constexpr = not EXACT
    nxt = q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u0, stop, r4, row_ok4, w4, N, EXACT)
    for step in range(nsteps):
        u4 = u0 + step * S
        words, s0, s1, s2, d, dmin = nxt
        if PREFETCH:
            nxt = q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u4 + S, stop, r4, row_ok4, w4, N, EXACT)
        else:
            words, s0, s1, s2, d, dmin = q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u4, stop, r4, row_ok4,
                                                   w4, N, EXACT)
        ok_u4 = u4 < stop
        scale, minimum = q4_k_sub_scales(s0, s1, s2, d, dmin, n4)       # [S, BLOCK_N, 8, 1]
        lo = words & 0x0F0F0F0F
        hi = (words >> 4) & 0x0F0F0F0F
        blk4 = u4 * 8 + n4                                               # [S, 1, 8, 1]
        acc0 += _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, m0, blk4, q4, ok_u4, K, masked, ASM)
        if R > 1:
            acc1 += _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, m0 + 1, blk4, q4, ok_u4, K, masked, ASM)
        if R > 2:
            acc2 += _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, m0 + 2, blk4, q4, ok_u4, K, masked, ASM)
        if R > 3:
            acc3 += _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, m0 + 3, blk4, q4, ok_u4, K, masked, ASM)
        if R > 4:
            acc4 += _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, m0 + 4, blk4, q4, ok_u4, K, masked, ASM)
        if R > 5:
            acc5 += _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, m0 + 5, blk4, q4, ok_u4, K, masked, ASM)
        if R > 6:
            acc6 += _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, m0 + 6, blk4, q4, ok_u4, K, masked, ASM)
        if R > 7:
            acc7 += _row_terms(lo, hi, scale, minimum, qa_ptr, da_ptr, m0 + 7, blk4, q4, ok_u4, K, masked, ASM)
    _store(out_ptr, acc0, m0, pid_k, rows, row_ok, M_PAD, N)
    if R > 1:
        _store(out_ptr, acc1, m0 + 1, pid_k, rows, row_ok, M_PAD, N)
    if R > 2:
        _store(out_ptr, acc2, m0 + 2, pid_k, rows, row_ok, M_PAD, N)
    if R > 3:
        _store(out_ptr, acc3, m0 + 3, pid_k, rows, row_ok, M_PAD, N)
    if R > 4:
        _store(out_ptr, acc4, m0 + 4, pid_k, rows, row_ok, M_PAD, N)
    if R > 5:
        _store(out_ptr, acc5, m0 + 5, pid_k, rows, row_ok, M_PAD, N)
    if R > 6:
        _store(out_ptr, acc6, m0 + 6, pid_k, rows, row_ok, M_PAD, N)
    if R > 7:
        _store(out_ptr, acc7, m0 + 7, pid_k, rows, row_ok, M_PAD, N)
