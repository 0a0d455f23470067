"""Q6_K row-tile GEMV kernel (the "rows" variant; frame and outputs: gguf_gemv/rows_common.py).

Planes (layout.py): ql u32 [in/256, out, 32] (word 4n + q, nibble 2j + h: low 4 bits of element
32n + 16h + 4j + q), qh u32 [in/256, out, 16] (word 2n + h, bits 8j + 2q: its high 2 bits),
scales int8 [in/256, out, 16] (sub-block t = 2n + h), d fp16 [in/256, out].

Per loop step (S super-blocks): ql as one [S, BLOCK_N, 8, 4] load (a thread's 16-byte vector: block n of
one row, 32 elements), qh and the scales of the two halves h as [S, BLOCK_N, 8, 1] tensors each, d
[S, BLOCK_N, 1, 1]; nibble 2j + h of the 4 words is 4 consecutive activations (32n + 16h + 4j + q).

Decode without conversion instructions: the 6-bit code c = low | high << 4 (0..63) is assembled in the
mantissa of 1.0: low nibble at bits 17..20, high pair at 21..22, so v = bits(0x3F800000 | c << 17) =
1 + c / 64 exactly. With ds = d * sc (exact: 11 x 8 significant bits), s = 64 ds and u = 96 ds (both
exact), w = s * v - u = ds * (c - 32): its exact value has <= 18 significant bits, so the FMA (one rounding)
returns it exactly, bit-equal to the reference's dequantized weight; only the fp32 accumulation order
differs. (Without FMA contraction, as in Triton's interpreter, s * v rounds first: 2**-24 relative.)
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.rows_common import (
    accumulate_rows,
    block_frame,
    field_to,
    load_where,
    plane_index,
    store_rows,
)


@triton.jit
def q6_k_load(ql_ptr, qh_ptr, scales_ptr, d_ptr, u4, stop, r4, row_ok4, n4, w4, N: tl.constexpr, EXACT: tl.constexpr):
    """Planes of super-blocks u4 [S, 1, 1, 1]: ql [S, BLOCK_N, 8, 4]; qh and int8 scales of halves 0 and 1
    [S, BLOCK_N, 8, 1] each; d [S, BLOCK_N, 1, 1] (float32). Masked (units past `stop` and rows past N read 0)
    unless EXACT (plane_index clamps instead; the dp4a kernel)."""
    plane = plane_index(u4, stop, r4, N, EXACT)
    ok = (u4 < stop) & row_ok4
    masked: tl.constexpr = not EXACT
    ql = load_where(ql_ptr + plane * 32 + w4, ok, masked)
    qh0 = load_where(qh_ptr + plane * 16 + 2 * n4, ok, masked)
    qh1 = load_where(qh_ptr + plane * 16 + 2 * n4 + 1, ok, masked)
    sc0 = load_where(scales_ptr + plane * 16 + 2 * n4, ok, masked)
    sc1 = load_where(scales_ptr + plane * 16 + 2 * n4 + 1, ok, masked)
    d = load_where(d_ptr + plane, ok, masked).to(tl.float32)
    return ql, qh0, qh1, sc0, sc1, d


@triton.jit
def q6_k_nibble_weights(ql, qh0, qh1, ds0, ds1, q4, i: tl.constexpr):
    """The weights d sc (c - 32) [S, BLOCK_N, 8, 4] at nibble i = 2j + h of the loaded ql words (elements
    32n + 16h + 4j + q); ds0 / ds1 = d * scale of sub-blocks 2n / 2n + 1 [S, BLOCK_N, 8, 1]."""
    low = field_to(ql, 4 * i, 17, 0x001E0000)
    if i % 2 == 0:
        high = ((qh0 >> (8 * (i // 2) + 2 * q4)) & 3) << 21
        ds = ds0
    else:
        high = ((qh1 >> (8 * (i // 2) + 2 * q4)) & 3) << 21
        ds = ds1
    v = (low | high | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + c / 64
    return (ds * 64.0) * v - ds * 96.0


@triton.jit
def q6_k_rows_kernel(
    x_ptr,
    ql_ptr,
    qh_ptr,
    scales_ptr,
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
    NSTEPS: tl.constexpr = (UNITS_PER_SPLIT + S - 1) // S
    rows, row_ok, r4, row_ok4, pid_k, start, stop, u0, n4, q4, w4 = block_frame(
        tl.program_id(0), BLOCK_N, N, S, UNITS_PER_SPLIT, K
    )
    e4 = n4 * 32 + q4  # element of (n, q) at h = j = 0
    acc0 = tl.zeros((S, BLOCK_N, 8, 4), tl.float32)
    acc1 = tl.zeros((S, BLOCK_N, 8, 4), tl.float32)
    acc2 = tl.zeros((S, BLOCK_N, 8, 4), tl.float32)
    acc3 = tl.zeros((S, BLOCK_N, 8, 4), tl.float32)
    nxt = q6_k_load(ql_ptr, qh_ptr, scales_ptr, d_ptr, u0, stop, r4, row_ok4, n4, w4, N, False)
    for step in range(NSTEPS):
        u4 = u0 + step * S
        ql, qh0, qh1, sc0, sc1, d = nxt
        if PREFETCH:
            nxt = q6_k_load(ql_ptr, qh_ptr, scales_ptr, d_ptr, u4 + S, stop, r4, row_ok4, n4, w4, N, False)
        else:
            ql, qh0, qh1, sc0, sc1, d = q6_k_load(
                ql_ptr, qh_ptr, scales_ptr, d_ptr, u4, stop, r4, row_ok4, n4, w4, N, False
            )
        ok_u = u4 < stop
        ds0 = d * sc0.to(tl.float32)  # [S, BLOCK_N, 8, 1] d * scale of sub-block 2n
        ds1 = d * sc1.to(tl.float32)  # ... of 2n + 1
        for i in tl.static_range(8):  # nibble i = 2j + h: elements 32n + 16h + 4j + q
            w = q6_k_nibble_weights(ql, qh0, qh1, ds0, ds1, q4, i)  # [S, BLOCK_N, 8, 4]
            acc0, acc1, acc2, acc3 = accumulate_rows(
                acc0, acc1, acc2, acc3, w, x_ptr, u4, ok_u, 16 * (i % 2) + 4 * (i // 2), e4, K, 256, M, True
            )
    store_rows(
        out_ptr,
        tl.sum(acc0, axis=3),
        tl.sum(acc1, axis=3),
        tl.sum(acc2, axis=3),
        tl.sum(acc3, axis=3),
        pid_k,
        rows,
        row_ok,
        M,
        N,
    )
