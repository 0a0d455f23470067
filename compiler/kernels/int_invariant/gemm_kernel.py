"""Triton GEMM for many rows: y [M, N] = x [M, K] @ W [N, K]^T for a GGUF-packed Q4_K / Q6_K W, the integer block
sums on the int8 tensor cores (`tl.dot(int8, int8) -> int32`), then the same float terms as the GEMV.

Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)): program (i, j) owns a BLOCK_M x BLOCK_N output tile and walks every
split of K (config.py) in order; inside a split, the 32-element blocks in increasing order, for each:
  - the activation tile int8 [BLOCK_M, 32]: the block's bytes of quantize_kernel.py's words, whose byte
    16 h + 4 c + j is element 8 j + 4 h + c;
  - the weight tile int8 [32, BLOCK_N] decoded from the packed planes in that same byte order (Q4_K: codes 0..15;
    Q6_K: code - 32, and the two 16-element halves as two tiles, each zero outside its half);
  - isum = the int8 MMA's int32 dot (exact: |isum| < 2**16 per dot), for Q6_K sc_0 half_0 + sc_1 half_1;
  - the block's term and the add into the split's acc [BLOCK_M, BLOCK_N] (terms.py: the GEMV's very operations).
The splits' sums are added in split order (total = s0; total = total + s1; ...), as matmul.py adds the GEMV's
partials. No float value depends on the tile shape or the MMA instruction: only integers cross the dot.

Rows past M and columns past N are clamped for the loads and masked at the store.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .terms import add_rn, q4_k_factors, q4_k_term, q6_k_term


@triton.jit
def _byte_order():
    """Index tensors [1, 2, 4, 4] of the activation byte order: (h, c, j) of byte 16 h + 4 c + j."""
    h = tl.arange(0, 2)[None, :, None, None]
    c = tl.arange(0, 4)[None, None, :, None]
    j = tl.arange(0, 4)[None, None, None, :]
    return h, c, j


@triton.jit
def _q4_k_tile(p0, plane, n, BLOCK_N: tl.constexpr):
    """int8 [BLOCK_N, 32] codes of sub-block n, byte order: element 8 j + 4 h + c is nibble 2 j + h of word c."""
    h, c, j = _byte_order()
    words = tl.load(p0 + plane[:, None, None, None] * 32 + 4 * n + c)  # [BLOCK_N, 1, 4, 1]
    codes = (words >> (4 * (2 * j + h)).to(tl.uint32)) & 15  # [BLOCK_N, 2, 4, 4]
    return tl.reshape(codes, (BLOCK_N, 32)).to(tl.int8)


@triton.jit
def _q6_k_tiles(p0, p1, plane, n, BLOCK_N: tl.constexpr):
    """int8 [BLOCK_N, 32] each, code - 32 of group n in byte order, one tile per 16-element half (zero elsewhere).
    Element e = 8 j + 4 h + c is element 16 h' + 4 j' + c of Q6_K's layout with h' = j // 2, j' = 2 (j % 2) + h:
    nibble 2 j' + h' of ql word c, bits 8 j' + 2 c of qh word 2n + h'."""
    h, c, j = _byte_order()
    half = j // 2
    jj = 2 * (j % 2) + h
    ql = tl.load(p0 + plane[:, None, None, None] * 32 + 4 * n + c)  # [BLOCK_N, 1, 4, 1]
    qh = tl.load(p1 + plane[:, None, None, None] * 16 + 2 * n + half)  # [BLOCK_N, 1, 1, 4]
    low = (ql >> (4 * (2 * jj + half)).to(tl.uint32)) & 15
    high = (qh >> (8 * jj + 2 * c).to(tl.uint32)) & 3
    codes = (low | (high << 4)).to(tl.int32) - 32  # [BLOCK_N, 2, 4, 4] in -32..31
    first = tl.reshape(tl.where(half == 0, codes, 0), (BLOCK_N, 32)).to(tl.int8)
    second = tl.reshape(tl.where(half == 1, codes, 0), (BLOCK_N, 32)).to(tl.int8)
    return first, second


@triton.jit
def _split_sum(
    xq_ptr,
    dx_ptr,
    sx_ptr,
    p0,
    p1,
    p2,
    p3,
    x_rows,
    w_cols,
    split,
    N: tl.constexpr,
    K: tl.constexpr,
    K_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    Q6: tl.constexpr,
    ASM: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] fp32: split `split`'s blocks added in order into acc = +0."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    bytes_at = tl.arange(0, 32)[None, :]
    for block in range(split * (K_SPLIT // 32), tl.minimum((split + 1) * K_SPLIT, K) // 32):
        n = block % 8
        plane = (block // 8) * N + w_cols  # [BLOCK_N] into the [K/256, N] planes
        x = tl.load(xq_ptr + x_rows[:, None] * K + block * 32 + bytes_at)  # int8 [BLOCK_M, 32]
        dx = tl.load(dx_ptr + x_rows * (K // 32) + block)[:, None]  # [BLOCK_M, 1]
        if Q6:
            first, second = _q6_k_tiles(p0, p1, plane, n, BLOCK_N)
            half0 = tl.dot(x, tl.trans(first), out_dtype=tl.int32)  # [BLOCK_M, BLOCK_N]: sum (code - 32) q
            half1 = tl.dot(x, tl.trans(second), out_dtype=tl.int32)
            sc0 = tl.load(p2 + plane * 16 + 2 * n).to(tl.int32)[None, :]
            sc1 = tl.load(p2 + plane * 16 + 2 * n + 1).to(tl.int32)[None, :]
            d = tl.load(p3 + plane).to(tl.float32)[None, :]
            term = q6_k_term(d, dx, sc0 * half0 + sc1 * half1, ASM)
        else:
            isum = tl.dot(x, tl.trans(_q4_k_tile(p0, plane, n, BLOCK_N)), out_dtype=tl.int32)
            s0 = tl.load(p1 + plane * 3)
            s1 = tl.load(p1 + plane * 3 + 1)
            s2 = tl.load(p1 + plane * 3 + 2)
            d = tl.load(p2 + plane).to(tl.float32)
            dmin = tl.load(p3 + plane).to(tl.float32)
            scale, minimum = q4_k_factors(s0, s1, s2, d, dmin, n)  # [BLOCK_N]
            sx = tl.load(sx_ptr + x_rows * (K // 32) + block)[:, None]
            term = q4_k_term(scale[None, :], minimum[None, :], dx, sx, isum, ASM)
        acc = add_rn(acc, term, ASM)
    return acc


@triton.jit
def int_gemm_kernel(
    xq_ptr,
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
    SPLITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    Q6: tl.constexpr,
    ASM: tl.constexpr,
):
    """xq int8 [M, K] (quantize_kernel.py's words as bytes), dx / sx float32 [M, K/32], planes p0..p3 (Q4_K: qs,
    scales, d, dmin; Q6_K when Q6: ql, qh, scales, d) -> out [M, N] in out's dtype."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    x_rows = tl.minimum(rows, M - 1).to(tl.int64)
    w_cols = tl.minimum(cols, N - 1)
    total = _split_sum(
        xq_ptr, dx_ptr, sx_ptr, p0, p1, p2, p3, x_rows, w_cols, 0, N, K, K_SPLIT, BLOCK_M, BLOCK_N, Q6, ASM
    )
    for split in range(1, SPLITS):
        part = _split_sum(
            xq_ptr, dx_ptr, sx_ptr, p0, p1, p2, p3, x_rows, w_cols, split, N, K, K_SPLIT, BLOCK_M, BLOCK_N, Q6, ASM
        )
        total = add_rn(total, part, ASM)
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])
