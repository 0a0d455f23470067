"""Triton GEMV for few rows: y [M, N] = x [M, K] @ W [N, K]^T for a GGUF-packed Q4_K / Q6_K W, on the int8
activations of quantize_kernel.py, the integer sums taken with dp4a (gguf_gemv/dp4a_body.py's helpers). It reads
only the packed planes (~4.5 / ~6.6 bits a weight), as the default decode GEMV does.

Grid (cdiv(M, R), cdiv(N, BLOCK_N), SPLITS): program (g, t, s) owns activation rows g R .. g R + R - 1, output
columns t BLOCK_N .., and split s of K (config.py's k_split, from the weight's shape), and writes that split's
sums to partial s of out [SPLITS, M, N] fp32; matmul.py adds the partials in split order. Its loop walks the split's
super-blocks in order and, inside one, sub-blocks (32-element blocks) 0..7 in order (tl.static_range: unrolled,
straight-line code), for each:
  - loads the block's code words [1, BLOCK_N, 4] (16 bytes a column) and activation words [R, 1, 4] per half;
  - integer sums [R, BLOCK_N]: Q4_K two dp4a per word (low and high nibbles against the two activation halves);
    Q6_K the 6-bit codes (ql | qh << 4) of each 16-element half against the activations permuted to Q6_K's order
    (dp4a_body.q4_words_as_q6), less 32 * (the half's sum of q), then sc_0 half_0 + sc_1 half_1 (exact int32);
  - the block's term and the add into acc [R, BLOCK_N] (terms.py: the GEMM's very operations).
Rows past M and columns past N are clamped for the loads (their lanes are never stored), so they cannot touch a
real row's sums. Per (row, column) the sequence of float operations is the GEMM's: README.md.

ASM=False (Triton's interpreter: no inline PTX) computes dp4a with shifts and multiplies over a trailing axis of the
4 bytes, the same integers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.dp4a_body import dp4a as dp4a_ptx
from ember.compiler.kernels.gguf_gemv.dp4a_body import q4_words_as_q6

from .terms import add_rn, q4_k_factors, q4_k_term, q6_k_term


@triton.jit
def dp4a(a, b, c, ASM: tl.constexpr):
    """c + sum over bytes k of a_k * b_k, a's bytes unsigned and b's signed (int32, broadcasting). With ASM the
    instruction (dp4a_body.dp4a); without, the bytes as a trailing axis (fewer interpreted operations than
    dp4a_body's per-byte loop, the same integers)."""
    if ASM:
        return dp4a_ptx(a, b, c, ASM)
    else:
        shifts = 8 * tl.arange(0, 4)
        a_bytes = (tl.expand_dims(a.to(tl.int32, bitcast=True), -1) >> shifts) & 255
        b_bytes = (tl.expand_dims(b, -1) << (24 - shifts)) >> 24
        return c + tl.sum(a_bytes * b_bytes, axis=-1)


@triton.jit
def _q4_k_block(p0, plane, words_at, n, a_lo, a_hi, scale, minimum, dx, sx, ASM: tl.constexpr):
    """Sub-block n's term: codes of word c, nibble i = element 4 i + c (gguf_gemv/layout.py); the activation
    words hold elements c, c + 8, c + 16, c + 24 (a_lo) and c + 4, ... (a_hi): low / high nibbles."""
    words = tl.load(p0 + plane[:, :, None] * 32 + 4 * n + words_at)  # [1, BLOCK_N, 4] uint32
    dot = dp4a(words & 0x0F0F0F0F, a_lo, dp4a((words >> 4) & 0x0F0F0F0F, a_hi, 0, ASM), ASM)  # [R, BLOCK_N, 4]
    isum = tl.sum(dot, axis=2)  # exact
    return q4_k_term(scale, minimum, dx, sx, isum, ASM)


@triton.jit
def _q6_k_block(p0, p1, p2, plane, words_at, n, a_lo, a_hi, d, dx, ASM: tl.constexpr):
    """Group n's term (sub-blocks 2n, 2n + 1): ql word c holds element 16 h + 4 j + c at nibble 2 j + h, qh word
    2n + h its high bits at 8 j + 2 c (gguf_gemv/layout.py)."""
    ql = tl.load(p0 + plane[:, :, None] * 32 + 4 * n + words_at)  # [1, BLOCK_N, 4]
    qh0 = tl.load(p1 + plane[:, :, None] * 16 + 2 * n)  # [1, BLOCK_N, 1]
    qh1 = tl.load(p1 + plane[:, :, None] * 16 + 2 * n + 1)
    lo = (ql & 0x0F0F0F0F) | (((qh0 >> (2 * words_at)) & 0x03030303) << 4)  # half 0: elements 4 j + c
    hi = ((ql >> 4) & 0x0F0F0F0F) | (((qh1 >> (2 * words_at)) & 0x03030303) << 4)  # half 1: 16 + 4 j + c
    x_lo, x_hi = q4_words_as_q6(a_lo, a_hi, ASM)  # [R, 1, 4]: the same elements, int8 lanes
    ones = tl.full(x_lo.shape, 0x01010101, tl.uint32)
    low_sum = tl.sum(dp4a(ones, x_lo, 0, ASM), axis=2)  # [R, 1]: sum of q over the half
    high_sum = tl.sum(dp4a(ones, x_hi, 0, ASM), axis=2)
    half0 = tl.sum(dp4a(lo, x_lo, 0, ASM), axis=2) - 32 * low_sum  # [R, BLOCK_N]: sum (code - 32) q, exact
    half1 = tl.sum(dp4a(hi, x_hi, 0, ASM), axis=2) - 32 * high_sum
    sc0 = tl.load(p2 + plane * 16 + 2 * n).to(tl.int32)  # [1, BLOCK_N]
    sc1 = tl.load(p2 + plane * 16 + 2 * n + 1).to(tl.int32)
    return q6_k_term(d, dx, sc0 * half0 + sc1 * half1, ASM)


@triton.jit
def int_gemv_kernel(
    qa_ptr,
    dx_ptr,
    sx_ptr,
    p0,
    p1,
    p2,
    p3,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    K_SPLIT: tl.constexpr,
    R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    Q6: tl.constexpr,
    ASM: tl.constexpr,
):
    """qa int32 [M, K/4], dx / sx float32 [M, K/32] (quantize_kernel.py), planes p0..p3 (Q4_K: qs, scales, d,
    dmin; Q6_K when Q6: ql, qh, scales, d) -> out [SPLITS, M, N] fp32, this program's split's sums."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    x_rows = tl.minimum(rows, M - 1)[:, None]  # [R, 1], clamped: loads unmasked, stores masked
    w_cols = tl.minimum(cols, N - 1)[None, :]  # [1, BLOCK_N]
    words_at = tl.arange(0, 4)[None, None, :]  # word c of a half-block
    acc = tl.zeros((R, BLOCK_N), tl.float32)
    for s in range(split * (K_SPLIT // 256), tl.minimum((split + 1) * K_SPLIT, K) // 256):
        plane = s * N + w_cols  # [1, BLOCK_N] into the [K/256, N] planes
        if Q6:
            d = tl.load(p3 + plane).to(tl.float32)
        else:
            s0 = tl.load(p1 + plane * 3)
            s1 = tl.load(p1 + plane * 3 + 1)
            s2 = tl.load(p1 + plane * 3 + 2)
            d = tl.load(p2 + plane).to(tl.float32)
            dmin = tl.load(p3 + plane).to(tl.float32)
        for n in tl.static_range(8):
            block = s * 8 + n  # the activation block (32 elements of K)
            a_lo = tl.load(qa_ptr + x_rows[:, :, None] * (K // 4) + block * 8 + words_at)  # [R, 1, 4]
            a_hi = tl.load(qa_ptr + x_rows[:, :, None] * (K // 4) + block * 8 + 4 + words_at)
            dx = tl.load(dx_ptr + x_rows * (K // 32) + block)  # [R, 1]
            if Q6:
                term = _q6_k_block(p0, p1, p2, plane, words_at, n, a_lo, a_hi, d, dx, ASM)
            else:
                sx = tl.load(sx_ptr + x_rows * (K // 32) + block)
                scale, minimum = q4_k_factors(s0, s1, s2, d, dmin, block % 8)
                term = _q4_k_block(p0, plane, words_at, n, a_lo, a_hi, scale, minimum, dx, sx, ASM)
            acc = add_rn(acc, term, ASM)
    offsets = split.to(tl.int64) * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(out_ptr + offsets, acc, mask=(rows < M)[:, None] & (cols < N)[None, :])
