"""Helpers shared by the row-tile GEMV kernels (gguf_gemv/rows_kernel.py, gguf_gemv/rows_q6_k.py, gguf_gemv/rows_q8_0.py).

The kernels' common frame (the "rows" variant of QuantMatmulConfig, m <= 4 activation rows):

  grid (cdiv(out, BLOCK_N), SPLIT_K). Program (pid_n, pid_k) owns output rows pid_n * BLOCK_N + [0, BLOCK_N)
  and the contiguous range of `units` [pid_k * UNITS_PER_SPLIT, min(+UNITS_PER_SPLIT, UNITS)) along `in`
  (a unit is a 256-element super-block for Q4_K / Q6_K and a 32-element block for Q8_0). It walks that
  range in steps of S units loaded together (one 3-D load [S, BLOCK_N, words] per plane), with the next
  step's loads issued before this step's math when PREFETCH. Units past the range (the tail of the last
  split, when UNITS_PER_SPLIT is not a multiple of S) and rows past `out` are masked: their codes read 0
  and their scales 0, so they add exactly 0.

  Output: out[pid_k, i, rows] for activation row i, i.e. [m, out] in the activation dtype when SPLIT_K == 1
  (one launch, nothing after it) or fp32 partials [SPLIT_K, m, out] that the caller sums.

All offsets are int32: every plane must hold < 2**31 elements (matmul.py checks).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def u2f(v):
    """Exact uint32 (< 2**23) -> float32 without a conversion instruction: one OR and one FADD."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def field_to(words, lo: tl.constexpr, dst: tl.constexpr, mask: tl.constexpr):
    """Bits lo.. of each word moved to bit dst, then AND `mask` (the field's bits at dst): one shift + one AND
    (which the caller's OR with an exponent pattern folds into a single LOP3)."""
    if lo <= dst:
        moved = words << (dst - lo)
    else:
        moved = words >> (lo - dst)
    return moved & mask


@triton.jit
def split_range(UNITS: tl.constexpr, UNITS_PER_SPLIT: tl.constexpr, S: tl.constexpr):
    """(pid_k, unit index [S, 1, 1] of step 0's S units, end of this program's range) for grid axis 1."""
    pid_k = tl.program_id(1)
    start = pid_k * UNITS_PER_SPLIT
    stop = tl.minimum(start + UNITS_PER_SPLIT, UNITS)
    return pid_k, start + tl.arange(0, S)[:, None, None], stop


@triton.jit
def row_tile(BLOCK_N: tl.constexpr, N: tl.constexpr):
    """(rows [BLOCK_N], row_ok [BLOCK_N], rows [1, BLOCK_N, 1], row_ok [1, BLOCK_N, 1]) of grid axis 0."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    return rows, row_ok, rows[None, :, None], row_ok[None, :, None]


@triton.jit
def block_frame(
    tile, BLOCK_N: tl.constexpr, N: tl.constexpr, S: tl.constexpr, UNITS_PER_SPLIT: tl.constexpr, K: tl.constexpr
):
    """The 4-D frame of the super-block kernels ([S, BLOCK_N, 8, 4] tiles: unit, row, block n of 32, word q)
    for row tile `tile` and grid axis 1's split: (rows, row_ok [BLOCK_N], r4, row_ok4 [1, BLOCK_N, 1, 1],
    pid_k, start and stop of the split's units, u0 [S, 1, 1, 1] step 0's units, n4 [1, 1, 8, 1], q4
    [1, 1, 1, 4], w4 = 4 n4 + q4: the word of (n, q))."""
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    pid_k = tl.program_id(1)
    start = pid_k * UNITS_PER_SPLIT
    stop = tl.minimum(start + UNITS_PER_SPLIT, K // 256)
    u0 = start + tl.arange(0, S)[:, None, None, None]
    n4 = tl.arange(0, 8)[None, None, :, None]
    q4 = tl.arange(0, 4)[None, None, None, :]
    return (
        rows,
        row_ok,
        rows[None, :, None, None],
        row_ok[None, :, None, None],
        pid_k,
        start,
        stop,
        u0,
        n4,
        q4,
        n4 * 4 + q4,
    )


@triton.jit
def plane_index(u4, stop, r4, N: tl.constexpr, EXACT: tl.constexpr):
    """Index into [in/256, out] planes of units u4 and rows r4 -> [S, BLOCK_N, 1, 1]. EXACT (the loads go
    unmasked): units past `stop` (only a prefetch past the range reads them, and never uses them) and rows
    past N re-read the last ones."""
    if EXACT:
        return tl.minimum(u4, stop - 1) * N + tl.minimum(r4, N - 1)
    return u4 * N + r4


@triton.jit
def load_where(ptrs, ok, MASKED: tl.constexpr):
    """tl.load(ptrs), 0 where not ok when MASKED; unmasked (no zero-filled registers, no predicates) otherwise."""
    if MASKED:
        return tl.load(ptrs, mask=ok, other=0)
    return tl.load(ptrs)


@triton.jit
def x_tile(
    x_ptr,
    i: tl.constexpr,
    u3,
    ok_u,
    offset: tl.constexpr,
    j3,
    K: tl.constexpr,
    UNIT: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Activation row i at u3 * UNIT + offset + j3 (u3 [S, 1, 1] units, j3 [1, 1, W]) -> float32 [S, 1, W],
    0 for units outside the program's range (ok_u [S, 1, 1]) when MASKED (else every unit is in range)."""
    return load_where(x_ptr + i * K + u3 * UNIT + offset + j3, ok_u, MASKED).to(tl.float32)


@triton.jit
def accumulate_rows(
    acc0,
    acc1,
    acc2,
    acc3,
    w,
    x_ptr,
    u3,
    ok_u,
    offset: tl.constexpr,
    j3,
    K: tl.constexpr,
    UNIT: tl.constexpr,
    M: tl.constexpr,
    MASKED: tl.constexpr,
):
    """acc_i += x_i * w for each of the M activation rows (w [S, BLOCK_N, W] decoded once, reused by every row)."""
    acc0 += x_tile(x_ptr, 0, u3, ok_u, offset, j3, K, UNIT, MASKED) * w
    if M > 1:
        acc1 += x_tile(x_ptr, 1, u3, ok_u, offset, j3, K, UNIT, MASKED) * w
    if M > 2:
        acc2 += x_tile(x_ptr, 2, u3, ok_u, offset, j3, K, UNIT, MASKED) * w
    if M > 3:
        acc3 += x_tile(x_ptr, 3, u3, ok_u, offset, j3, K, UNIT, MASKED) * w
    return acc0, acc1, acc2, acc3


@triton.jit
def store_row(out_ptr, acc, i: tl.constexpr, pid_k, rows, row_ok, M: tl.constexpr, N: tl.constexpr):
    """acc [S, BLOCK_N, W] fp32 of activation row i -> out[pid_k, i, rows] in the output's dtype."""
    y = tl.sum(tl.sum(acc, axis=0), axis=1)  # s first: thread-local in the usual layouts, then across lanes
    tl.store(out_ptr + (pid_k * M + i) * N + rows, y.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def store_rows(out_ptr, acc0, acc1, acc2, acc3, pid_k, rows, row_ok, M: tl.constexpr, N: tl.constexpr):
    """store_row for each of the M activation rows."""
    store_row(out_ptr, acc0, 0, pid_k, rows, row_ok, M, N)
    if M > 1:
        store_row(out_ptr, acc1, 1, pid_k, rows, row_ok, M, N)
    if M > 2:
        store_row(out_ptr, acc2, 2, pid_k, rows, row_ok, M, N)
    if M > 3:
        store_row(out_ptr, acc3, 3, pid_k, rows, row_ok, M, N)
