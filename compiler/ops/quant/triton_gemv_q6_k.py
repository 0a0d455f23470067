"""Q6_K row-tile GEMV kernel (the "rows" variant; frame and outputs: triton_gemv_common.py).

Planes (layout.py): ql u32 [in/256, out, 32] (bits 4n.. of word 16g + j: low 4 bits of element
16(8g + n) + j), qh u32 [in/256, out, 16] (bits 2t.. of word j: high 2 bits of element 16t + j),
scales int8 [in/256, out, 16], d fp16 [in/256, out]. Sub-block t (16 elements) = 8g + n.

Per loop step: ql as two [S, BLOCK_N, 16] loads (words 0..15 for sub-blocks 0..7, 16..31 for 8..15),
qh [S, BLOCK_N, 16], the 16 int8 scales as 4 u32 words [S, BLOCK_N, 1] each (a u32 view of the plane:
its rows are 16 bytes, so word k holds scales 4k..4k+3), d [S, BLOCK_N, 1].

Decode without conversion instructions: the 6-bit code q = low | high << 4 (0..63) is assembled in the
mantissa of 1.0: low nibble at bits 17..20, high pair at 21..22, so v = bits(0x3F800000 | q << 17) =
1 + q / 64 exactly (per weight: shift + AND of ql, shift + AND|OR of qh, one OR: ~4 integer ops, for 6.56
bits per weight where Q4_K has ~2 ops for 4.5 bits). With ds = d * sc (exact: 11 x 8 significant
bits), s = 64 ds and u = 96 ds (both exact), w = s * v - u = ds * (q - 32): its exact value has <= 18
significant bits, so the FMA (one rounding) returns it exactly, bit-equal to the reference's dequantized
weight; only the fp32 accumulation order differs. (Without FMA contraction, as in Triton's interpreter,
s * v rounds first: 2**-24 relative, still far inside the tolerance.) The int8 scale becomes a float as
bits(0x4B000000 | (byte ^ 0x80)) - (2**23 + 128) (exact).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.ops.quant.triton_gemv_common import (accumulate_rows, field_to, row_tile, split_range, store_rows,
                                                         u2f)


@triton.jit
def _q6_k_load(ql_ptr, qh_ptr, sw_ptr, d_ptr, u3, stop, r3, row_ok3, j3, N: tl.constexpr):
    """Planes of super-blocks u3 [S, 1, 1]: ql halves and qh [S, BLOCK_N, 16], scale words and d [S, BLOCK_N, 1]."""
    ok = (u3 < stop) & row_ok3
    plane = u3 * N + r3
    lo = tl.load(ql_ptr + plane * 32 + j3, mask=ok, other=0)        # sub-blocks 0..7
    hi = tl.load(ql_ptr + plane * 32 + 16 + j3, mask=ok, other=0)   # sub-blocks 8..15
    qh = tl.load(qh_ptr + plane * 16 + j3, mask=ok, other=0)
    w0 = tl.load(sw_ptr + plane * 4, mask=ok, other=0)
    w1 = tl.load(sw_ptr + plane * 4 + 1, mask=ok, other=0)
    w2 = tl.load(sw_ptr + plane * 4 + 2, mask=ok, other=0)
    w3 = tl.load(sw_ptr + plane * 4 + 3, mask=ok, other=0)
    d = tl.load(d_ptr + plane, mask=ok, other=0.0).to(tl.float32)
    return lo, hi, qh, w0, w1, w2, w3, d


@triton.jit
def _scale(sw, t: tl.constexpr):
    """Signed scale byte t % 4 of the scale word -> float32 (exact, no conversion instruction)."""
    return u2f(((sw >> (8 * (t % 4))) & 0xFF) ^ 0x80) - 128.0


@triton.jit
def q6_k_rows_kernel(x_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr,
                     M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                     S: tl.constexpr, UNITS_PER_SPLIT: tl.constexpr, PREFETCH: tl.constexpr):
    NSTEPS: tl.constexpr = (UNITS_PER_SPLIT + S - 1) // S
    rows, row_ok, r3, row_ok3 = row_tile(BLOCK_N, N)
    pid_k, u0, stop = split_range(K // 256, UNITS_PER_SPLIT, S)
    sw_ptr = scales_ptr.to(tl.pointer_type(tl.uint32))  # int8 [in/256, out, 16] seen as u32 [in/256, out, 4]
    j3 = tl.arange(0, 16)[None, None, :]
    acc0 = tl.zeros((S, BLOCK_N, 16), tl.float32)
    acc1 = tl.zeros((S, BLOCK_N, 16), tl.float32)
    acc2 = tl.zeros((S, BLOCK_N, 16), tl.float32)
    acc3 = tl.zeros((S, BLOCK_N, 16), tl.float32)
    nxt = _q6_k_load(ql_ptr, qh_ptr, sw_ptr, d_ptr, u0, stop, r3, row_ok3, j3, N)
    for step in range(NSTEPS):
        u3 = u0 + step * S
        lo, hi, qh, w0, w1, w2, w3, d = nxt
        if PREFETCH:
            nxt = _q6_k_load(ql_ptr, qh_ptr, sw_ptr, d_ptr, u3 + S, stop, r3, row_ok3, j3, N)
        else:
            lo, hi, qh, w0, w1, w2, w3, d = _q6_k_load(ql_ptr, qh_ptr, sw_ptr, d_ptr, u3, stop, r3, row_ok3, j3, N)
        ok_u = u3 < stop
        for t in tl.static_range(16):
            if t < 4:
                ds = d * _scale(w0, t)                   # [S, BLOCK_N, 1]
            elif t < 8:
                ds = d * _scale(w1, t)
            elif t < 12:
                ds = d * _scale(w2, t)
            else:
                ds = d * _scale(w3, t)
            if t < 8:
                low = field_to(lo, 4 * t, 17, 0x001E0000)
            else:
                low = field_to(hi, 4 * (t - 8), 17, 0x001E0000)
            high = field_to(qh, 2 * t, 21, 0x00600000)
            v = (low | high | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + q / 64
            w = (ds * 64.0) * v - ds * 96.0              # [S, BLOCK_N, 16] = d sc (q - 32)
            acc0, acc1, acc2, acc3 = accumulate_rows(acc0, acc1, acc2, acc3, w, x_ptr, u3, ok_u, 16 * t, j3, K,
                                                     256, M, True)
    store_rows(out_ptr, acc0, acc1, acc2, acc3, pid_k, rows, row_ok, M, N)
