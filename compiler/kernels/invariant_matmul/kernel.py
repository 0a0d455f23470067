"""Triton kernel: y [M, N] = x [M, K] @ w [N, K]^T with every row computed the same way whatever M is
(the deterministic plans' projections; config.py says what fixes a row's arithmetic).

The weight comes in one of two forms, FMT: "dense" (w [N, K] in x's dtype at p0) or a GGUF format whose packed
planes p0..p3 (gguf_gemm.PLANES' order) are decoded tile by tile in registers (gguf_gemm's tile decoders) and
rounded once to x's dtype. A GGUF value is exact in fp32 and rounds once (gguf_gemv/reference.py), so a decoded
tile holds the bits of the dense copy made at load; the dots that follow are the same instructions, so the two
forms give the same bits and a plan may read the packed blocks for few rows and the copy for many.

Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLITS or 1). Program (i, j, s) owns rows i*BLOCK_M.., columns
j*BLOCK_N.. and, with SPLIT_PROGRAMS, split s: the K range [s*K_SPLIT, min((s+1)*K_SPLIT, K)) walked in
BLOCK_K steps, `acc = tl.dot(x_tile, w_tile^T, acc)` from a zeroed fp32 accumulator, stored as partial s
([SPLITS, M, N] fp32; `fixed_order_partials_sum` adds them in split order). Without SPLIT_PROGRAMS the program
walks every split itself and adds each split's accumulator to a running total in the same order
(total = p0; total = total + p1; ...), so both forms give the same bits: the split count follows the weight,
the form follows the rows.

Rows past M and K past its end load as 0: they add exact zeros and are never stored. Operands keep their
dtype (bf16 on the tensor cores, fp32 as "ieee" dots), accumulation is fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemm.kernel import weight_tile


@triton.jit
def _split_sum(
    x_ptr,
    p0,
    p1,
    p2,
    p3,
    rows,
    cols,
    split,
    M,
    N: tl.constexpr,
    K: tl.constexpr,
    K_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FMT: tl.constexpr,
    IEEE: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] fp32: split `split`'s share of x[rows] @ w[cols]^T, from zero."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    w_rows = tl.minimum(cols, N - 1)  # packed tiles load unmasked (clamped rows); their extra columns are not stored
    for start in range(split * K_SPLIT, tl.minimum((split + 1) * K_SPLIT, K), BLOCK_K):
        k = start + ks
        k_ok = k < K
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * K + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        if FMT == "dense":
            w = tl.load(
                p0 + cols[:, None].to(tl.int64) * K + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0
            )
        else:  # BLOCK_K divides K and 256 here (matmul.py checks): whole 32-element groups, one super-block
            w = weight_tile(p0, p1, p2, p3, start, w_rows, N, BLOCK_K // 32, FMT).to(x.dtype)
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit
def invariant_matmul_kernel(
    x_ptr,
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
    BLOCK_K: tl.constexpr,
    SPLIT_PROGRAMS: tl.constexpr,
    FMT: tl.constexpr,
    IEEE: tl.constexpr,
):
    # x [M, K], w [N, K] (dense at p0, or packed planes p0..p3) -> out: [SPLITS, M, N] fp32 partials (SPLIT_PROGRAMS) or [M, N] in out's dtype
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    if SPLIT_PROGRAMS:
        split = tl.program_id(2)
        acc = _split_sum(
            x_ptr, p0, p1, p2, p3, rows, cols, split, M, N, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, FMT, IEEE
        )
        tl.store(out_ptr + split.to(tl.int64) * M * N + offsets, acc, mask=mask)
    else:
        total = _split_sum(x_ptr, p0, p1, p2, p3, rows, cols, 0, M, N, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, FMT, IEEE)
        for split in range(1, SPLITS):
            total = total + _split_sum(
                x_ptr, p0, p1, p2, p3, rows, cols, split, M, N, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, FMT, IEEE
            )
        tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=mask)
