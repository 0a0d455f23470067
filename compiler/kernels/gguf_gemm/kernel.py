"""The quantized GEMM: y [M, N] = x [M, K] @ dequant(W).T for a GGUF-packed W [N, K], for steps of many rows
(batched decode, prefill chunks), reading only the packed blocks (no dense copy of W anywhere).

One program owns a BLOCK_M x BLOCK_N output tile and walks K in tiles of BLOCK_K = SUB * 32 elements: it
dequantizes the weight tile [BLOCK_N, BLOCK_K] into registers (tiles.py), rounds it once to the
activation dtype and feeds it with the activation tile [BLOCK_M, BLOCK_K] to `tl.dot` (bf16 tensor-core
MMA, fp32 accumulation; fp32 activations use input_precision="ieee"). Dequantizing costs a few integer
and float ops per weight per program; a BLOCK_M of 64-128 rows amortises it, and the weight bytes read
are the packed ones (4.5 bits a Q4_K weight instead of 16).

Grid: one axis of cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs, ordered in groups of GROUP_M row tiles
that sweep the output columns together, so a weight tile is read from HBM once per group and from L2 by
the group's other programs (prefill: thousands of rows).

Rows past M and outputs past N are clamped for the loads (unmasked) and masked at the store. Offsets are
int32: every plane and x must hold < 2**31 elements (gemm.py checks).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemm.tiles import q4_k_tile, q5_0_tile, q6_k_tile, q8_0_tile


@triton.jit
def weight_tile(p0, p1, p2, p3, k0, rows, N: tl.constexpr, SUB: tl.constexpr, FMT: tl.constexpr):
    """fp32 [BLOCK_N, SUB * 32]: the planes p0.. in the order gemm.PLANES names them for FMT."""
    if FMT == "q4_k":
        w = q4_k_tile(p0, p1, p2, p3, k0, rows, N, SUB)
    elif FMT == "q6_k":
        w = q6_k_tile(p0, p1, p2, p3, k0, rows, N, SUB)
    elif FMT == "q8_0":
        w = q8_0_tile(p0, p1, k0, rows, N, SUB)
    else:
        w = q5_0_tile(p0, p1, p2, k0, rows, N, SUB)
    return w


@triton.jit
def quant_gemm_kernel(
    x_ptr,
    p0,
    p1,
    p2,
    p3,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SUB: tl.constexpr,
    GROUP_M: tl.constexpr,
    IEEE: tl.constexpr,
):
    BLOCK_K: tl.constexpr = SUB * 32
    tiles_m: tl.constexpr = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    pid = tl.program_id(0)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)  # the last group may hold fewer row tiles
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x_rows = tl.minimum(ms, M - 1)  # clamped: loads unmasked, stores masked
    w_rows = tl.minimum(rows, N - 1)
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(K // BLOCK_K):
        k0 = kt * BLOCK_K
        xs = tl.load(x_ptr + x_rows[:, None] * K + k0 + cols[None, :])  # [BLOCK_M, BLOCK_K]
        w = weight_tile(p0, p1, p2, p3, k0, w_rows, N, SUB, FMT)  # [BLOCK_N, BLOCK_K] fp32
        if IEEE:
            acc = tl.dot(xs, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(xs, tl.trans(w.to(xs.dtype)), acc)
    ptrs = out_ptr + ms[:, None] * N + rows[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=(ms < M)[:, None] & (rows < N)[None, :])
