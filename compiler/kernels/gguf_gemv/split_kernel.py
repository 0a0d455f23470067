"""Triton GEMV kernels over the quantized layouts of layout.py (decode: few activation rows).

Grid: (out / BLOCK_N, SPLIT_K, ceil(m / BLOCK_M)). A program owns BLOCK_N output rows and one slice of
`in` (all of it unless split-K), walks its blocks in order and keeps the weights quantized all the way
to registers: per block it loads the tile's codes (BLOCK_N runs of 16 bytes per Q4_K sub-block),
its scales, and the activations of the block (tiny, shared by every program, so L1/L2 hits).

Per sub-block the codes are small integers, exact in bf16, so the integer dot product x . q is exact
in fp32 and the sub-block scale is applied once to that sum (Q4_K's minimum term uses sum(x)):
    y += (d * sc) * (x . q) - (dmin * m) * sum(x)
Two ways to form x . q, chosen by the constexpr USE_DOT:
  - USE_DOT (m > 1): tl.dot on tensor cores, x padded to BLOCK_M = 16 rows (masked loads), codes
    converted to the activation dtype (f32 activations use input_precision="ieee": no TF32 rounding);
  - not USE_DOT (m == 1, BLOCK_M = 1): CUDA-core FMAs into a [sub-block, BLOCK_N] fp32 accumulator
    whose axis 0 is reduced once at the end, so no cross-thread reduction sits inside the loop.
Outputs are written in the output's dtype (the activation dtype, or fp32 partials [SPLIT_K, m, out]
that the caller sums when SPLIT_K > 1). Offsets are int32: every plane must hold < 2**31 elements.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _q4_k_scale_min(s0, s1, s2, n: tl.constexpr):
    """6-bit scale and min of sub-block n from GGUF's 12 packed bytes (3 little-endian words)."""
    if n < 4:
        sc = (s0 >> (8 * n)) & 63
        mn = (s1 >> (8 * n)) & 63
    else:
        sc = ((s2 >> (8 * (n - 4))) & 15) | (((s0 >> (8 * (n - 4) + 6)) & 3) << 4)
        mn = ((s2 >> (8 * (n - 4) + 4)) & 15) | (((s1 >> (8 * (n - 4) + 6)) & 3) << 4)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _load_x(x_ptr, ms, m_ok, k_start, K: tl.constexpr, WIDTH: tl.constexpr):
    """Activations x[ms, k_start : k_start + WIDTH] -> [BLOCK_M, WIDTH] (rows past m read as 0)."""
    cols = k_start + tl.arange(0, WIDTH)
    return tl.load(x_ptr + ms[:, None] * K + cols[None, :], mask=m_ok[:, None], other=0.0)


@triton.jit
def _accumulate(acc, xs, codes, scale, USE_DOT: tl.constexpr, IEEE: tl.constexpr):
    """acc += scale * (xs . codes), per output row.

    xs [BLOCK_M, W] activations, codes [W, BLOCK_N] small integers, scale [BLOCK_N] fp32.
    USE_DOT: acc is [BLOCK_M, BLOCK_N]; otherwise BLOCK_M == 1 and acc is [W, BLOCK_N] (reduced later).
    """
    if USE_DOT:
        q = codes.to(xs.dtype)
        if IEEE:
            part = tl.dot(xs, q, input_precision="ieee")
        else:
            part = tl.dot(xs, q)
        acc += part * scale[None, :]
    else:
        acc += codes.to(tl.float32) * (tl.trans(xs.to(tl.float32)) * scale[None, :])
    return acc


@triton.jit
def _finish(acc, out_ptr, pid_k, ms, m_ok, rows, row_ok, M: tl.constexpr, N: tl.constexpr, USE_DOT: tl.constexpr):
    """Reduce (CUDA-core path) and store [BLOCK_M, BLOCK_N] into out[pid_k, ms, rows]."""
    if USE_DOT:
        y = acc
    else:
        y = tl.sum(acc, axis=0)[None, :]
    ptrs = out_ptr + pid_k * M * N + ms[:, None] * N + rows[None, :]
    tl.store(ptrs, y.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & row_ok[None, :])


@triton.jit
def q4_k_gemv_kernel(
    x_ptr,
    qs_ptr,
    scales_ptr,
    d_ptr,
    dmin_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEPS_PER_SPLIT: tl.constexpr,
    USE_DOT: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output rows
    row_ok = rows < N
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] activation rows
    m_ok = ms < M
    i = tl.arange(0, 8)  # element 4i + q of a sub-block is nibble i of its word q
    q = tl.arange(0, 4)
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc = tl.zeros((32, BLOCK_N), tl.float32)
    acc_min = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)  # sum over sub-blocks of (dmin * m) * sum(x)
    start = pid_k * STEPS_PER_SPLIT
    stop = tl.minimum(start + STEPS_PER_SPLIT, K // 256)
    for sb in range(start, stop):
        plane = sb * N + rows  # [BLOCK_N] index into a [in/256, out] plane
        s0 = tl.load(scales_ptr + plane * 3, mask=row_ok, other=0)
        s1 = tl.load(scales_ptr + plane * 3 + 1, mask=row_ok, other=0)
        s2 = tl.load(scales_ptr + plane * 3 + 2, mask=row_ok, other=0)
        d = tl.load(d_ptr + plane, mask=row_ok, other=0.0).to(tl.float32)
        dmin = tl.load(dmin_ptr + plane, mask=row_ok, other=0.0).to(tl.float32)
        for n in tl.static_range(8):
            sc, mn = _q4_k_scale_min(s0, s1, s2, n)
            words = tl.load(
                qs_ptr + (plane * 32 + 4 * n)[None, :] + q[:, None], mask=row_ok[None, :], other=0
            )  # [4, BLOCK_N]: sub-block n
            codes = tl.reshape((words[None, :, :] >> (4 * i)[:, None, None]) & 15, (32, BLOCK_N))  # [4i + q, ..]
            xs = _load_x(x_ptr, ms, m_ok, sb * 256 + 32 * n, K, 32)  # [BLOCK_M, 32]
            acc_min += tl.sum(xs.to(tl.float32), axis=1)[:, None] * (dmin * mn)[None, :]
            acc = _accumulate(acc, xs, codes, d * sc, USE_DOT, IEEE)
    if USE_DOT:
        acc = acc - acc_min
        _finish(acc, out_ptr, pid_k, ms, m_ok, rows, row_ok, M, N, USE_DOT)
    else:
        y = tl.sum(acc, axis=0)[None, :] - acc_min
        _finish(y, out_ptr, pid_k, ms, m_ok, rows, row_ok, M, N, True)


@triton.jit
def q6_k_gemv_kernel(
    x_ptr,
    ql_ptr,
    qh_ptr,
    scales_ptr,
    d_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEPS_PER_SPLIT: tl.constexpr,
    USE_DOT: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = ms < M
    jj = tl.arange(0, 4)[:, None, None]  # element 4j + q of a sub-block (h: which half of block n)
    qq = tl.arange(0, 4)[None, :, None]
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc = tl.zeros((16, BLOCK_N), tl.float32)
    start = pid_k * STEPS_PER_SPLIT
    stop = tl.minimum(start + STEPS_PER_SPLIT, K // 256)
    for sb in range(start, stop):
        plane = sb * N + rows
        d = tl.load(d_ptr + plane, mask=row_ok, other=0.0).to(tl.float32)
        for n in tl.static_range(8):
            words = tl.load(
                ql_ptr + (plane * 32 + 4 * n)[None, None, :] + qq, mask=row_ok[None, None, :], other=0
            )  # [1, 4, BLOCK_N]: block n
            for h in tl.static_range(2):
                qh = tl.load(qh_ptr + plane * 16 + 2 * n + h, mask=row_ok, other=0)[None, None, :]
                low = (words >> (4 * (2 * jj + h))) & 15  # [4, 4, BLOCK_N]
                high = (qh >> (8 * jj + 2 * qq)) & 3
                q = tl.reshape((low | (high << 4)).to(tl.int32) - 32, (16, BLOCK_N))  # [4j + q, ..] in -32..31
                sc = tl.load(scales_ptr + plane * 16 + 2 * n + h, mask=row_ok, other=0).to(tl.float32)
                xs = _load_x(x_ptr, ms, m_ok, sb * 256 + 32 * n + 16 * h, K, 16)  # [BLOCK_M, 16]
                acc = _accumulate(acc, xs, q, d * sc, USE_DOT, IEEE)
    _finish(acc, out_ptr, pid_k, ms, m_ok, rows, row_ok, M, N, USE_DOT)


@triton.jit
def _block_codes(qs_ptr, qh_ptr, plane, row_ok, j, Q5: tl.constexpr):
    """Signed codes [32, BLOCK_N] of one 32-element block per row (plane [BLOCK_N]): Q8_0's int8 as stored,
    or Q5_0's (nibble | 5th bit << 4) - 16 (layout.py); 0 (Q5_0: -16, under a zero scale) past the rows."""
    if Q5:
        byte = tl.load(qs_ptr + (plane * 16)[None, :] + (j % 16)[:, None], mask=row_ok[None, :], other=0)
        high = (tl.load(qh_ptr + plane, mask=row_ok, other=0)[None, :] >> j.to(tl.uint32)[:, None]) & 1
        q = (((byte.to(tl.int32) >> (4 * (j // 16))[:, None]) & 15) | (high.to(tl.int32) << 4)) - 16
    else:
        q = tl.load(qs_ptr + (plane * 32)[None, :] + j[:, None], mask=row_ok[None, :], other=0)
    return q


@triton.jit
def _blocks_gemv(
    x_ptr,
    qs_ptr,
    qh_ptr,
    d_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEPS_PER_SPLIT: tl.constexpr,
    BLOCKS_PER_STEP: tl.constexpr,
    USE_DOT: tl.constexpr,
    IEEE: tl.constexpr,
    Q5: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = ms < M
    j = tl.arange(0, 32)
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc = tl.zeros((32, BLOCK_N), tl.float32)
    start = pid_k * STEPS_PER_SPLIT
    stop = tl.minimum(start + STEPS_PER_SPLIT, K // (32 * BLOCKS_PER_STEP))
    for step in range(start, stop):
        for b in tl.static_range(BLOCKS_PER_STEP):
            block = step * BLOCKS_PER_STEP + b
            plane = block * N + rows
            q = _block_codes(qs_ptr, qh_ptr, plane, row_ok, j, Q5)  # [32, BLOCK_N]
            d = tl.load(d_ptr + plane, mask=row_ok, other=0.0).to(tl.float32)
            xs = _load_x(x_ptr, ms, m_ok, block * 32, K, 32)
            acc = _accumulate(acc, xs, q, d, USE_DOT, IEEE)
    _finish(acc, out_ptr, pid_k, ms, m_ok, rows, row_ok, M, N, USE_DOT)


@triton.jit
def q8_0_gemv_kernel(
    x_ptr,
    qs_ptr,
    d_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEPS_PER_SPLIT: tl.constexpr,
    BLOCKS_PER_STEP: tl.constexpr,
    USE_DOT: tl.constexpr,
    IEEE: tl.constexpr,
):
    _blocks_gemv(
        x_ptr,
        qs_ptr,
        qs_ptr,
        d_ptr,
        out_ptr,
        M,
        N,
        K,
        BLOCK_M,
        BLOCK_N,
        STEPS_PER_SPLIT,
        BLOCKS_PER_STEP,
        USE_DOT,
        IEEE,
        False,
    )


@triton.jit
def q5_0_gemv_kernel(
    x_ptr,
    qs_ptr,
    qh_ptr,
    d_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEPS_PER_SPLIT: tl.constexpr,
    BLOCKS_PER_STEP: tl.constexpr,
    USE_DOT: tl.constexpr,
    IEEE: tl.constexpr,
):
    _blocks_gemv(
        x_ptr,
        qs_ptr,
        qh_ptr,
        d_ptr,
        out_ptr,
        M,
        N,
        K,
        BLOCK_M,
        BLOCK_N,
        STEPS_PER_SPLIT,
        BLOCKS_PER_STEP,
        USE_DOT,
        IEEE,
        True,
    )


# format -> (kernel, plane names in the kernel's argument order)
KERNELS = {
    "q4_k": (q4_k_gemv_kernel, ("qs", "scales", "d", "dmin")),
    "q6_k": (q6_k_gemv_kernel, ("ql", "qh", "scales", "d")),
    "q8_0": (q8_0_gemv_kernel, ("qs", "d")),
    "q5_0": (q5_0_gemv_kernel, ("qs", "qh", "d")),
}
