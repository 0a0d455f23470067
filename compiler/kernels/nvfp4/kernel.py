"""The NVFP4 matmul on a GPU: y [M, N] = x [M, K] @ W.T for an NVFP4 W (reference.py's layout), the weight kept
packed (4.5 bits a weight) and dequantized tile by tile in registers, any row count (a decode GEMV at M = 1,
batched decode and prefill at more).

One program owns BLOCK_M x BLOCK_N outputs and walks K in tiles of BLOCK_K elements: it loads the tile's
packed bytes [BLOCK_N, BLOCK_K / 2] and their FP8 scales, makes the even elements (low nibbles) and the odd
ones (high nibbles) as two bf16 halves, and multiplies them with the matching even / odd activation columns
(two tl.dot of BLOCK_K / 2), so no interleave of the two nibbles is ever built. E2M1 and E4M3 are decoded
by building the fp32 bit pattern (no table, no conversion instruction); code x scale is exact in bf16. The
per-row FP32 scale multiplies the fp32 accumulator once at the end.

Rows past M and outputs past N are clamped for the loads and masked at the store; int32 offsets (nvfp4.py
checks the sizes).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1(code):
    """4-bit codes (int32) -> float32: sign bit 3, exponent bits 1-2 (bias 1), mantissa bit 0; exponent 0 is
    0 or the subnormal 0.5."""
    e = (code >> 1) & 3
    m = code & 1
    bits = tl.where(e == 0, m * (126 << 23), ((e + 126) << 23) | (m << 22))
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e4m3(byte):
    """FP8 E4M3 bit patterns (int32 0..255) -> float32 (bias 7; exponent 0: subnormal m * 2**-9)."""
    e = (byte >> 3) & 15
    m = byte & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    value = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    return tl.where((byte & 128) != 0, -value, value)


@triton.jit
def nvfp4_matmul_kernel(
    x_ptr,
    packed_ptr,
    scales_ptr,
    row_scale_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    HALF: tl.constexpr = BLOCK_K // 2
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x_rows = tl.minimum(ms, M - 1)[:, None]  # [BLOCK_M, 1]
    w_rows = tl.minimum(rows, N - 1)[:, None]  # [BLOCK_N, 1]
    j = tl.arange(0, HALF)[None, :]  # byte j of the tile: elements 2j and 2j + 1
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(K // BLOCK_K):
        k0 = kt * BLOCK_K
        byte = tl.load(packed_ptr + w_rows * (K // 2) + k0 // 2 + j).to(tl.int32)  # [BLOCK_N, HALF]
        scale = e4m3(tl.load(scales_ptr + w_rows * (K // 16) + (k0 + 2 * j) // 16).to(tl.int32))
        even = e2m1(byte & 15) * scale
        odd = e2m1(byte >> 4) * scale
        x_even = tl.load(x_ptr + x_rows * K + k0 + 2 * j)  # [BLOCK_M, HALF]
        x_odd = tl.load(x_ptr + x_rows * K + k0 + 2 * j + 1)
        if IEEE:
            acc = tl.dot(x_even, tl.trans(even), acc, input_precision="ieee")
            acc = tl.dot(x_odd, tl.trans(odd), acc, input_precision="ieee")
        else:
            acc = tl.dot(x_even, tl.trans(even.to(x_even.dtype)), acc)
            acc = tl.dot(x_odd, tl.trans(odd.to(x_odd.dtype)), acc)
    acc = acc * tl.load(row_scale_ptr + tl.minimum(rows, N - 1))[None, :]
    ptrs = out_ptr + ms[:, None] * N + rows[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=(ms < M)[:, None] & (rows < N)[None, :])
