"""Triton kernel: y [M, N] = x [M, K] @ w [N, K]^T with every row computed the same way whatever M is
(the deterministic plans' projections; config.py says what fixes a row's arithmetic).

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


@triton.jit
def _split_sum(
    x_ptr,
    w_ptr,
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
    IEEE: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] fp32: split `split`'s share of x[rows] @ w[cols]^T, from zero."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    for start in range(split * K_SPLIT, tl.minimum((split + 1) * K_SPLIT, K), BLOCK_K):
        k = start + ks
        k_ok = k < K
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * K + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        w = tl.load(
            w_ptr + cols[:, None].to(tl.int64) * K + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0
        )
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit
def invariant_matmul_kernel(
    x_ptr,
    w_ptr,
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
    IEEE: tl.constexpr,
):
    # x [M, K], w [N, K] -> out: [SPLITS, M, N] fp32 partials (SPLIT_PROGRAMS) or [M, N] in out's dtype
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    if SPLIT_PROGRAMS:
        split = tl.program_id(2)
        acc = _split_sum(x_ptr, w_ptr, rows, cols, split, M, N, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, IEEE)
        tl.store(out_ptr + split.to(tl.int64) * M * N + offsets, acc, mask=mask)
    else:
        total = _split_sum(x_ptr, w_ptr, rows, cols, 0, M, N, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, IEEE)
        for split in range(1, SPLITS):
            total = total + _split_sum(
                x_ptr, w_ptr, rows, cols, split, M, N, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, IEEE
            )
        tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=mask)
