"""Q8_0 and Q5_0 row-tile GEMV kernels (the "rows" variant; frame and outputs: gguf_gemv/rows_common.py).

Both formats are blocks of 32 elements with one fp16 scale, so one body serves them (constexpr Q5):
  Q8_0 planes (layout.py): qs int8 [in/32, out, 32], d fp16 [in/32, out]: codes as stored.
  Q5_0 planes: qs uint8 [in/32, out, 16] (byte l: low 4 bits of elements l and l + 16), qh uint32
      [in/32, out] (bit j: 5th bit of element j), d: code j = (nibble | bit << 4) - 16, built from a load of
      the block's 16 bytes gathered per element (each byte read twice, from L1) and one of its qh word.
A unit is one 32-element block; a loop step loads S blocks together: codes [S, BLOCK_N, 32] and d
[S, BLOCK_N, 1]. matmul.py's plan passes S = 8 * sb_per_step, so a step covers as many elements of `in` as
sb_per_step super-blocks of the K-quant kernels.

Decode without a conversion instruction: with q the signed code, (q << 15) + 0x3FC00000 =
0x3F800000 + (q + 128) << 15 (q + 128 in 0..255 lands in mantissa bits 15..22), so v = 1 + (q + 128) / 256
exactly (per weight: the byte's sign extension, one shift-add). With s = 256 d and u = 384 d (both exact:
d is fp16), w = s * v - u = d q in one FMA; d q has <= 19 significant bits, so w is exact, bit-equal to
the reference's dequantized weight (without FMA contraction, in the interpreter, s * v rounds first by
at most 2**-24 relative).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.rows_common import accumulate_rows, row_tile, split_range, store_rows


@triton.jit
def block_load(qs_ptr, qh_ptr, d_ptr, u3, stop, r3, row_ok3, j3, N: tl.constexpr, Q5: tl.constexpr):
    """Planes of blocks u3 [S, 1, 1]: signed codes [S, BLOCK_N, 32], d [S, BLOCK_N, 1] float32 (0 masked)."""
    ok = (u3 < stop) & row_ok3
    plane = u3 * N + r3
    if Q5:
        byte = tl.load(qs_ptr + plane * 16 + j3 % 16, mask=ok, other=0).to(tl.int32)
        high = (tl.load(qh_ptr + plane, mask=ok, other=0) >> j3.to(tl.uint32)) & 1
        q = (((byte >> (4 * (j3 // 16))) & 15) | (high.to(tl.int32) << 4)) - 16
    else:
        q = tl.load(qs_ptr + plane * 32 + j3, mask=ok, other=0)
    d = tl.load(d_ptr + plane, mask=ok, other=0.0).to(tl.float32)
    return q, d


@triton.jit
def _block_rows(
    x_ptr,
    qs_ptr,
    qh_ptr,
    d_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
    UNITS_PER_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,
    Q5: tl.constexpr,
):
    NSTEPS: tl.constexpr = (UNITS_PER_SPLIT + S - 1) // S
    rows, row_ok, r3, row_ok3 = row_tile(BLOCK_N, N)
    pid_k, u0, stop = split_range(K // 32, UNITS_PER_SPLIT, S)
    j3 = tl.arange(0, 32)[None, None, :]
    acc0 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    acc1 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    acc2 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    acc3 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    nxt = block_load(qs_ptr, qh_ptr, d_ptr, u0, stop, r3, row_ok3, j3, N, Q5)
    for step in range(NSTEPS):
        u3 = u0 + step * S
        q, d = nxt
        if PREFETCH:
            nxt = block_load(qs_ptr, qh_ptr, d_ptr, u3 + S, stop, r3, row_ok3, j3, N, Q5)
        else:
            q, d = block_load(qs_ptr, qh_ptr, d_ptr, u3, stop, r3, row_ok3, j3, N, Q5)
        ok_u = u3 < stop
        v = ((q.to(tl.int32) << 15) + 0x3FC00000).to(tl.float32, bitcast=True)  # 1 + (q + 128) / 256
        w = (d * 256.0) * v - d * 384.0  # [S, BLOCK_N, 32] = d q
        acc0, acc1, acc2, acc3 = accumulate_rows(acc0, acc1, acc2, acc3, w, x_ptr, u3, ok_u, 0, j3, K, 32, M, True)
    store_rows(out_ptr, acc0, acc1, acc2, acc3, pid_k, rows, row_ok, M, N)


@triton.jit
def q8_0_rows_kernel(
    x_ptr,
    qs_ptr,
    d_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
    UNITS_PER_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    _block_rows(x_ptr, qs_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, BLOCK_N, S, UNITS_PER_SPLIT, PREFETCH, False)


@triton.jit
def q5_0_rows_kernel(
    x_ptr,
    qs_ptr,
    qh_ptr,
    d_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
    UNITS_PER_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    _block_rows(x_ptr, qs_ptr, qh_ptr, d_ptr, out_ptr, M, N, K, BLOCK_N, S, UNITS_PER_SPLIT, PREFETCH, True)
