"""Row-tile GEMV kernels for decode (m <= 4 activation rows), the "rows" variant of QuantMatmulConfig.

The grid, split-K ranges and outputs are triton_gemv_common.py's frame; this module holds the Q4_K
kernel and the registry ROWS_KERNELS (Q6_K: triton_gemv_q6_k.py, Q8_0: triton_gemv_q8_0.py).

Why this shape (decode reads each weight once, so the H200 must keep ~25-40 KB in flight per SM, and
the SM's integer pipe, 64 lanes/clk against 128 FP32, allows ~2 integer + ~2 FP ops per 4-bit weight):
  - split-K (grid axis 1) and small row tiles (BLOCK_N down to 4) give enough programs when `out` is
    small and `in` long (e.g. 1536 x 8960: 35 super-blocks per row would otherwise serialise);
  - a loop step loads S super-blocks as ONE 3-D load [S, BLOCK_N, 32] of u32 nibble words (the
    block-major layout makes each [BLOCK_N, 32] slab contiguous; S is a tensor axis, so the S slabs
    are in flight together), and PREFETCH issues the next step's loads before this step's math (a
    register double buffer);
  - no int->float conversion instruction (quarter rate): a nibble c goes into the mantissa of 1.0,
    v = bits(0x3F800000 | c << 19) = 1 + c / 16 (exact), and with s = 16 d sc, u = s + dmin m the weight
    is w = s * v - u = d sc c - dmin m in one FMA. Per weight: shift, and|or (one LOP3), FMA, and one
    FMA per activation row. The 6-bit scales become floats as bits(0x4B000000 | sc) - 2**23 (exact).
Precision: s = 16 d sc is exact (fp16 d: 11 significant bits, sc < 64), dmin m exact; u = s + dmin m is
rounded once, an error of 2**-24 |u| with |u| ~ 16 d sc, i.e. ~2**-20 of a code step d sc, and the FMA
rounds w once: w is within ~2**-20 of a code step of the reference's d sc c - dmin m, far inside the fp32
test tolerance (1e-4 relative). Accumulation is fp32, as the reference's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.ops.quant.triton_gemv_common import (accumulate_rows, field_to, row_tile, split_range, store_rows,
                                                         u2f)
from ember.compiler.ops.quant.triton_gemv_q6_k import q6_k_rows_kernel
from ember.compiler.ops.quant.triton_gemv_q8_0 import q8_0_rows_kernel


@triton.jit
def _q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u3, stop, r3, row_ok3, j3, N: tl.constexpr):
    """Planes of super-blocks u3 [S, 1, 1] for the tile: words [S, BLOCK_N, 32], the rest [S, BLOCK_N, 1]."""
    ok = (u3 < stop) & row_ok3
    plane = u3 * N + r3                                  # [S, BLOCK_N, 1] index into [in/256, out] planes
    words = tl.load(qs_ptr + plane * 32 + j3, mask=ok, other=0)
    s0 = tl.load(scales_ptr + plane * 3, mask=ok, other=0)
    s1 = tl.load(scales_ptr + plane * 3 + 1, mask=ok, other=0)
    s2 = tl.load(scales_ptr + plane * 3 + 2, mask=ok, other=0)
    d = tl.load(d_ptr + plane, mask=ok, other=0.0).to(tl.float32)
    dmin = tl.load(dmin_ptr + plane, mask=ok, other=0.0).to(tl.float32)
    return words, s0, s1, s2, d, dmin


@triton.jit
def q4_k_rows_kernel(x_ptr, qs_ptr, scales_ptr, d_ptr, dmin_ptr, out_ptr,
                     M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                     S: tl.constexpr, UNITS_PER_SPLIT: tl.constexpr, PREFETCH: tl.constexpr):
    NSTEPS: tl.constexpr = (UNITS_PER_SPLIT + S - 1) // S
    rows, row_ok, r3, row_ok3 = row_tile(BLOCK_N, N)
    pid_k, u0, stop = split_range(K // 256, UNITS_PER_SPLIT, S)
    j3 = tl.arange(0, 32)[None, None, :]
    acc0 = tl.zeros((S, BLOCK_N, 32), tl.float32)       # one accumulator per activation row, reduced at the end
    acc1 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    acc2 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    acc3 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    nxt = _q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u0, stop, r3, row_ok3, j3, N)
    for step in range(NSTEPS):
        u3 = u0 + step * S
        words, s0, s1, s2, d, dmin = nxt
        if PREFETCH:  # the next step's loads go out before this step's math (masked off past the range)
            nxt = _q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u3 + S, stop, r3, row_ok3, j3, N)
        else:
            words, s0, s1, s2, d, dmin = _q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u3, stop, r3, row_ok3,
                                                    j3, N)
        ok_u = u3 < stop
        d16 = d * 16.0
        for n in tl.static_range(8):
            if n < 4:
                sc = (s0 >> (8 * n)) & 63
                mn = (s1 >> (8 * n)) & 63
            else:
                sc = ((s2 >> (8 * (n - 4))) & 15) | (((s0 >> (8 * (n - 4) + 6)) & 3) << 4)
                mn = ((s2 >> (8 * (n - 4) + 4)) & 15) | (((s1 >> (8 * (n - 4) + 6)) & 3) << 4)
            s = d16 * u2f(sc)                            # [S, BLOCK_N, 1]
            u = s + dmin * u2f(mn)
            v = (field_to(words, 4 * n, 19, 0x00780000) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + c/16
            w = s * v - u                                # [S, BLOCK_N, 32] = d sc c - dmin m
            acc0, acc1, acc2, acc3 = accumulate_rows(acc0, acc1, acc2, acc3, w, x_ptr, u3, ok_u, 32 * n, j3, K,
                                                     256, M)
    store_rows(out_ptr, acc0, acc1, acc2, acc3, pid_k, rows, row_ok, M, N)


# format -> (kernel, plane names in the kernel's argument order); the plans: matmul.py _rows_plan
ROWS_KERNELS = {
    "q4_k": (q4_k_rows_kernel, ("qs", "scales", "d", "dmin")),
    "q6_k": (q6_k_rows_kernel, ("ql", "qh", "scales", "d")),
    "q8_0": (q8_0_rows_kernel, ("qs", "d")),
}
