"""The integer-dot GEMV's body (gguf_gemv/dp4a_kernel.py's kernels are thin entries to `dp4a_gemv_body`): the dp4a
instruction (inline PTX, or shifts and multiplies for Triton's interpreter), the code words' decode into int8
lanes, the per-block terms of each activation row, the accumulation over a split's super-blocks, and the
stores. The module docstring of gguf_gemv/dp4a_kernel.py describes the frame and the arithmetic.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.rows_common import block_frame, load_where
from ember.compiler.kernels.gguf_gemv.rows_kernel import q4_k_load, q4_k_sub_scales
from ember.compiler.kernels.gguf_gemv.rows_q6_k import q6_k_load


@triton.jit
def dp4a(a, b, c, ASM: tl.constexpr):
    """c + sum over bytes k of a_k * b_k, a's bytes unsigned and b's signed (int32 results)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1
        )
    else:
        a32 = a.to(tl.int32, bitcast=True)
        total = c
        for k in tl.static_range(4):
            total += ((a32 >> (8 * k)) & 255) * ((b << (24 - 8 * k)) >> 24)
        return total


@triton.jit
def q4_words_as_q6(a_lo, a_hi, ASM: tl.constexpr):
    """Activation words packed for Q4_K (act_quant.PACKINGS: word w of a block holds its elements w, w + 8,
    w + 16, w + 24) -> the Q6_K packing's words (word 4 a + b: 16 a + b, 16 a + b + 4, + 8, + 12). a_lo holds
    words 0..3 of each block, a_hi words 4..7 (b = 0..3 each); Q6_K word b takes bytes 0, 1 of Q4_K words b
    and b + 4, its word 4 + b their bytes 2, 3: one byte permute (prmt) per word, the integers unchanged."""
    if ASM:
        lo = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x5140;", "=r,r,r", [a_lo, a_hi], dtype=tl.int32, is_pure=True, pack=1
        )
        hi = tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, 0x7362;", "=r,r,r", [a_lo, a_hi], dtype=tl.int32, is_pure=True, pack=1
        )
        return lo, hi
    else:
        lo = (a_lo & 255) | ((a_hi & 255) << 8) | (((a_lo >> 8) & 255) << 16) | (((a_hi >> 8) & 255) << 24)
        hi = (
            ((a_lo >> 16) & 255)
            | (((a_hi >> 16) & 255) << 8)
            | (((a_lo >> 24) & 255) << 16)
            | (((a_hi >> 24) & 255) << 24)
        )
        return lo, hi


@triton.jit
def _load(p0, p1, p2, p3, u4, stop, r4, row_ok4, n4, w4, N: tl.constexpr, EXACT: tl.constexpr, Q6: tl.constexpr):
    if Q6:
        return q6_k_load(p0, p1, p2, p3, u4, stop, r4, row_ok4, n4, w4, N, EXACT)
    else:
        return q4_k_load(p0, p1, p2, p3, u4, stop, r4, row_ok4, w4, N, EXACT)


@triton.jit
def _decode(planes, n4, q4, Q6: tl.constexpr):
    """-> (lo, hi) code bytes [S, BLOCK_N, 8, 4] and two per-block factors [S, BLOCK_N, 8, 1]: Q4_K (d sc,
    dmin m) of sub-block n; Q6_K (d sc) of the halves (sub-blocks 2n, 2n + 1)."""
    if Q6:
        ql, qh0, qh1, sc0, sc1, d = planes
        lo = (ql & 0x0F0F0F0F) | (((qh0 >> (2 * q4)) & 0x03030303) << 4)
        hi = ((ql >> 4) & 0x0F0F0F0F) | (((qh1 >> (2 * q4)) & 0x03030303) << 4)
        return lo, hi, d * sc0.to(tl.float32), d * sc1.to(tl.float32)
    else:
        words, s0, s1, s2, d, dmin = planes
        scale, minimum = q4_k_sub_scales(s0, s1, s2, d, dmin, n4)
        return words & 0x0F0F0F0F, (words >> 4) & 0x0F0F0F0F, scale, minimum


@triton.jit
def _term(
    lo,
    hi,
    f0,
    f1,
    qa_ptr,
    da_ptr,
    row,
    blk4,
    q4,
    ok_u4,
    K: tl.constexpr,
    MASKED: tl.constexpr,
    Q6: tl.constexpr,
    ACT_Q4: tl.constexpr,
    ASM: tl.constexpr,
    TERMS: tl.constexpr,
    T: tl.constexpr,
):
    """Term T of activation row `row` for the step's blocks: float32 [S, BLOCK_N, 8, 1] (the Q4_K minimums'
    -f1 sx with the first term only). lo/hi [S, BLOCK_N, 8, 4] code bytes; blk4 [S, 1, 8, 1] activation block
    of each code block. ACT_Q4 (Q6 only): the activations are packed for Q4_K, their words permuted here."""
    words = qa_ptr + row * (TERMS * K // 4) + T * (K // 4) + blk4 * 8 + q4  # [S, 1, 8, 4]
    a_lo = load_where(words, ok_u4, MASKED)
    a_hi = load_where(words + 4, ok_u4, MASKED)
    if ACT_Q4:
        a_lo, a_hi = q4_words_as_q6(a_lo, a_hi, ASM)
    scales = da_ptr + (row * (K // 32) + blk4) * (4 * TERMS) + 4 * T  # [S, 1, 8, 1]: dx, sx, s0, s1
    dx = load_where(scales, ok_u4, MASKED)
    if Q6:
        s0 = load_where(scales + 2, ok_u4, MASKED)
        s1 = load_where(scales + 3, ok_u4, MASKED)
        sum0 = tl.sum(dp4a(lo, a_lo, 0, ASM), axis=3, keep_dims=True).to(tl.float32) - 32.0 * s0  # exact
        sum1 = tl.sum(dp4a(hi, a_hi, 0, ASM), axis=3, keep_dims=True).to(tl.float32) - 32.0 * s1
        return dx * (f0 * sum0 + f1 * sum1)
    else:
        dot = dp4a(hi, a_hi, dp4a(lo, a_lo, 0, ASM), ASM)
        total = tl.sum(dot, axis=3, keep_dims=True).to(tl.float32)  # exact: < 2**16 in magnitude
        if T == 0:
            sx = load_where(scales + 1, ok_u4, MASKED)
            return f0 * (dx * total) - f1 * sx
        else:
            return f0 * (dx * total)


@triton.jit
def _row_terms(
    lo,
    hi,
    f0,
    f1,
    qa_ptr,
    da_ptr,
    row,
    blk4,
    q4,
    ok_u4,
    K: tl.constexpr,
    MASKED: tl.constexpr,
    Q6: tl.constexpr,
    ACT_Q4: tl.constexpr,
    ASM: tl.constexpr,
    TERMS: tl.constexpr,
):
    """Activation row `row`'s contribution for the step's blocks, its terms summed: float32 [S, BLOCK_N, 8, 1]."""
    y = _term(lo, hi, f0, f1, qa_ptr, da_ptr, row, blk4, q4, ok_u4, K, MASKED, Q6, ACT_Q4, ASM, TERMS, 0)
    if TERMS > 1:
        y += _term(lo, hi, f0, f1, qa_ptr, da_ptr, row, blk4, q4, ok_u4, K, MASKED, Q6, ACT_Q4, ASM, TERMS, 1)
    return y


@triton.jit
def _accumulate(
    qa_ptr,
    da_ptr,
    p0,
    p1,
    p2,
    p3,
    M_PAD: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
    UNITS_PER_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,
    EXACT: tl.constexpr,
    Q6: tl.constexpr,
    ACT_Q4: tl.constexpr,
    ASM: tl.constexpr,
    TILE0: tl.constexpr,
    TERMS: tl.constexpr,
):
    """The program's sums: (rows, row_ok [BLOCK_N], pid_k, first activation row m0, acc0..acc7) with acc_i
    [S, BLOCK_N, 8, 1] fp32 of activation row m0 + i (those past R stay 0). TILE0: row tiles of the grid
    before this weight's first (the pair kernel's second weight)."""
    GROUPS: tl.constexpr = M_PAD // R
    rows, row_ok, r4, row_ok4, pid_k, start, stop, u0, n4, q4, w4 = block_frame(
        tl.program_id(0) // GROUPS - TILE0, BLOCK_N, N, S, UNITS_PER_SPLIT, K
    )
    m0 = (tl.program_id(0) % GROUPS) * R
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
    nxt = _load(p0, p1, p2, p3, u0, stop, r4, row_ok4, n4, w4, N, EXACT, Q6)
    for step in range(nsteps):
        u4 = u0 + step * S
        planes = nxt
        if PREFETCH:
            nxt = _load(p0, p1, p2, p3, u4 + S, stop, r4, row_ok4, n4, w4, N, EXACT, Q6)
        else:
            planes = _load(p0, p1, p2, p3, u4, stop, r4, row_ok4, n4, w4, N, EXACT, Q6)
        ok_u4 = u4 < stop
        lo, hi, f0, f1 = _decode(planes, n4, q4, Q6)  # codes; per-block factors
        blk4 = u4 * 8 + n4  # [S, 1, 8, 1]
        acc0 += _row_terms(lo, hi, f0, f1, qa_ptr, da_ptr, m0, blk4, q4, ok_u4, K, masked, Q6, ACT_Q4, ASM, TERMS)
        if R > 1:
            acc1 += _row_terms(
                lo, hi, f0, f1, qa_ptr, da_ptr, m0 + 1, blk4, q4, ok_u4, K, masked, Q6, ACT_Q4, ASM, TERMS
            )
        if R > 2:
            acc2 += _row_terms(
                lo, hi, f0, f1, qa_ptr, da_ptr, m0 + 2, blk4, q4, ok_u4, K, masked, Q6, ACT_Q4, ASM, TERMS
            )
        if R > 3:
            acc3 += _row_terms(
                lo, hi, f0, f1, qa_ptr, da_ptr, m0 + 3, blk4, q4, ok_u4, K, masked, Q6, ACT_Q4, ASM, TERMS
            )
        if R > 4:
            acc4 += _row_terms(
                lo, hi, f0, f1, qa_ptr, da_ptr, m0 + 4, blk4, q4, ok_u4, K, masked, Q6, ACT_Q4, ASM, TERMS
            )
        if R > 5:
            acc5 += _row_terms(
                lo, hi, f0, f1, qa_ptr, da_ptr, m0 + 5, blk4, q4, ok_u4, K, masked, Q6, ACT_Q4, ASM, TERMS
            )
        if R > 6:
            acc6 += _row_terms(
                lo, hi, f0, f1, qa_ptr, da_ptr, m0 + 6, blk4, q4, ok_u4, K, masked, Q6, ACT_Q4, ASM, TERMS
            )
        if R > 7:
            acc7 += _row_terms(
                lo, hi, f0, f1, qa_ptr, da_ptr, m0 + 7, blk4, q4, ok_u4, K, masked, Q6, ACT_Q4, ASM, TERMS
            )
    return rows, row_ok, pid_k, m0, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit
def _store(
    bias_ptr,
    out_ptr,
    out2_ptr,
    out3_ptr,
    acc,
    row,
    pid_k,
    rows,
    row_ok,
    M_PAD: tl.constexpr,
    N: tl.constexpr,
    N1: tl.constexpr,
    N2: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_OFFSET: tl.constexpr,
):
    """Activation row `row`'s sums acc -> out[pid_k, row] of [SPLIT_K, M_PAD, N] when N1 == N (one output);
    else (one split) rows [0, N1) -> out [M_PAD, N1], [N1, N2) -> out2, [N2, N) -> out3. HAS_BIAS adds
    bias[BIAS_OFFSET + rows] as linear_quant's _add_bias does: the product rounded to the output dtype, plus
    the bias, rounded again."""
    dtype = out_ptr.dtype.element_ty
    y = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=0)  # [BLOCK_N]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + BIAS_OFFSET + rows, mask=row_ok, other=0.0)
        y = y.to(dtype).to(tl.float32) + bias.to(tl.float32)
    if N1 == N:
        ptrs = out_ptr + (pid_k * M_PAD + row) * N + rows
    else:
        ptrs = tl.where(
            rows < N1,
            out_ptr + row * N1 + rows,
            tl.where(rows < N2, out2_ptr + row * (N2 - N1) + (rows - N1), out3_ptr + row * (N - N2) + (rows - N2)),
        )
    tl.store(ptrs, y.to(dtype), mask=row_ok)


@triton.jit
def dp4a_gemv_body(
    qa_ptr,
    da_ptr,
    p0,
    p1,
    p2,
    p3,
    bias_ptr,
    out_ptr,
    out2_ptr,
    out3_ptr,
    M_PAD: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
    UNITS_PER_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,
    EXACT: tl.constexpr,
    Q6: tl.constexpr,
    ACT_Q4: tl.constexpr,
    ASM: tl.constexpr,
    N1: tl.constexpr,
    N2: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_OFFSET: tl.constexpr,
    TILE0: tl.constexpr = 0,
    TERMS: tl.constexpr = 1,
):
    """The kernels' body: the program's sums, then one _store per activation row of its group."""
    rows, row_ok, pid_k, m0, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _accumulate(
        qa_ptr,
        da_ptr,
        p0,
        p1,
        p2,
        p3,
        M_PAD,
        N,
        K,
        R,
        BLOCK_N,
        S,
        UNITS_PER_SPLIT,
        PREFETCH,
        EXACT,
        Q6,
        ACT_Q4,
        ASM,
        TILE0,
        TERMS,
    )
    out = (bias_ptr, out_ptr, out2_ptr, out3_ptr)
    _store(*out, acc0, m0, pid_k, rows, row_ok, M_PAD, N, N1, N2, HAS_BIAS, BIAS_OFFSET)
    if R > 1:
        _store(*out, acc1, m0 + 1, pid_k, rows, row_ok, M_PAD, N, N1, N2, HAS_BIAS, BIAS_OFFSET)
    if R > 2:
        _store(*out, acc2, m0 + 2, pid_k, rows, row_ok, M_PAD, N, N1, N2, HAS_BIAS, BIAS_OFFSET)
    if R > 3:
        _store(*out, acc3, m0 + 3, pid_k, rows, row_ok, M_PAD, N, N1, N2, HAS_BIAS, BIAS_OFFSET)
    if R > 4:
        _store(*out, acc4, m0 + 4, pid_k, rows, row_ok, M_PAD, N, N1, N2, HAS_BIAS, BIAS_OFFSET)
    if R > 5:
        _store(*out, acc5, m0 + 5, pid_k, rows, row_ok, M_PAD, N, N1, N2, HAS_BIAS, BIAS_OFFSET)
    if R > 6:
        _store(*out, acc6, m0 + 6, pid_k, rows, row_ok, M_PAD, N, N1, N2, HAS_BIAS, BIAS_OFFSET)
    if R > 7:
        _store(*out, acc7, m0 + 7, pid_k, rows, row_ok, M_PAD, N, N1, N2, HAS_BIAS, BIAS_OFFSET)
