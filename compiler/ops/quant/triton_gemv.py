"""Row-tile GEMV kernels for decode (m <= 4 activation rows), the "rows" variant of QuantMatmulConfig.

Why a second kernel: the split-K kernels of triton_kernels.py spend more issue slots than the HBM
stream allows at m = 1 (per weight: shift, and, a quarter-rate int->float conversion, a multiply by
the activation-times-scale and the FMA, plus two more int->float conversions per sub-block for the
6-bit scales), keep one super-block in flight per program, and add their split-K partials in a
second XLA op. Here:

  - one program owns BLOCK_N output rows and ALL of `in`; the grid is just out / BLOCK_N and the
    kernel writes [m, out] in the activation dtype: one launch per projection, nothing before/after;
  - a loop step covers S super-blocks as ONE 3-D load [S, BLOCK_N, 32] of u32 nibble words (the
    block-major layout makes each [BLOCK_N, 32] slab one contiguous run; S is a tensor axis, so
    the S slabs are in flight together), and the next step's loads are issued before the current
    step is computed (a register double buffer: PREFETCH);
  - no int->float conversion instruction: a nibble c is placed in the mantissa of 1.0,
    v = bits(0x3F800000 | c << 19) = 1 + c / 16 (exact), and with s = 16 d sc, u = s + dmin m,
    the weight is w = s * v - u = d sc c - dmin m (one FMA); the 6-bit scales become floats as
    bits(0x4B000000 | sc) - 2**23 (exact). Per weight: shift, and/or (one LOP3), FMA, FMA;
  - the activation rows (M <= 4, constexpr) reuse each decoded weight: one more FMA per row.
Accumulators are [S, BLOCK_N, 32] fp32 per activation row, reduced once at the end.
Offsets are int32: every plane must hold < 2**31 elements.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _u2f(v):
    """Exact uint32 (< 2**23) -> float32 without a conversion instruction."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _nibble_as_float(words, n: tl.constexpr):
    """Code n (bits 4n..4n+3) of each word -> 1 + code / 16 as float32."""
    if 4 * n <= 19:
        bits = (words << (19 - 4 * n)) & 0x00780000
    else:
        bits = (words >> (4 * n - 19)) & 0x00780000
    return (bits | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, step, s3, r3, j3, row_ok3,
               N: tl.constexpr, NSB: tl.constexpr, S: tl.constexpr):
    """Planes of super-blocks step*S .. step*S + S - 1 for the tile: words [S, BLOCK_N, 32], rest [S, BLOCK_N, 1]."""
    sb = step * S + s3                                   # [S, 1, 1]
    ok = (sb < NSB) & row_ok3                            # [S, BLOCK_N, 1]
    plane = sb * N + r3                                  # [S, BLOCK_N, 1]
    words = tl.load(qs_ptr + plane * 32 + j3, mask=ok, other=0)
    s0 = tl.load(scales_ptr + plane * 3, mask=ok, other=0)
    s1 = tl.load(scales_ptr + plane * 3 + 1, mask=ok, other=0)
    s2 = tl.load(scales_ptr + plane * 3 + 2, mask=ok, other=0)
    d = tl.load(d_ptr + plane, mask=ok, other=0.0).to(tl.float32)
    dmin = tl.load(dmin_ptr + plane, mask=ok, other=0.0).to(tl.float32)
    return words, s0, s1, s2, d, dmin


@triton.jit
def _x_tile(x_ptr, i: tl.constexpr, step, s3, j3, n: tl.constexpr, K: tl.constexpr, NSB: tl.constexpr,
            S: tl.constexpr):
    """Activation row i, sub-block n of the step's S super-blocks -> float32 [S, 1, 32] (0 past `in`)."""
    sb = step * S + s3
    return tl.load(x_ptr + i * K + sb * 256 + 32 * n + j3, mask=sb < NSB, other=0.0).to(tl.float32)


@triton.jit
def q4_k_rows_kernel(x_ptr, qs_ptr, scales_ptr, d_ptr, dmin_ptr, out_ptr,
                     M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                     S: tl.constexpr, PREFETCH: tl.constexpr):
    NSB: tl.constexpr = K // 256
    NSTEPS: tl.constexpr = (NSB + S - 1) // S
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    s3 = tl.arange(0, S)[:, None, None]
    r3 = rows[None, :, None]
    row_ok3 = row_ok[None, :, None]
    j3 = tl.arange(0, 32)[None, None, :]
    acc0 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    acc1 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    acc2 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    acc3 = tl.zeros((S, BLOCK_N, 32), tl.float32)
    nxt = _q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, 0, s3, r3, j3, row_ok3, N, NSB, S)
    for step in range(NSTEPS):
        words, s0, s1, s2, d, dmin = nxt
        if PREFETCH:  # issue the next step's loads before this step's math (masked off past the end)
            nxt = _q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, step + 1, s3, r3, j3, row_ok3, N, NSB, S)
        else:
            words, s0, s1, s2, d, dmin = _q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, step, s3, r3, j3,
                                                    row_ok3, N, NSB, S)
        d16 = d * 16.0
        for n in tl.static_range(8):
            if n < 4:
                sc = (s0 >> (8 * n)) & 63
                mn = (s1 >> (8 * n)) & 63
            else:
                sc = ((s2 >> (8 * (n - 4))) & 15) | (((s0 >> (8 * (n - 4) + 6)) & 3) << 4)
                mn = ((s2 >> (8 * (n - 4) + 4)) & 15) | (((s1 >> (8 * (n - 4) + 6)) & 3) << 4)
            s = d16 * _u2f(sc)                          # [S, BLOCK_N, 1]
            u = s + dmin * _u2f(mn)
            w = s * _nibble_as_float(words, n) - u       # [S, BLOCK_N, 32] = d sc c - dmin m
            acc0 += _x_tile(x_ptr, 0, step, s3, j3, n, K, NSB, S) * w
            if M > 1:
                acc1 += _x_tile(x_ptr, 1, step, s3, j3, n, K, NSB, S) * w
            if M > 2:
                acc2 += _x_tile(x_ptr, 2, step, s3, j3, n, K, NSB, S) * w
            if M > 3:
                acc3 += _x_tile(x_ptr, 3, step, s3, j3, n, K, NSB, S) * w
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + rows, tl.sum(tl.sum(acc0, axis=2), axis=0).to(ty), mask=row_ok)
    if M > 1:
        tl.store(out_ptr + N + rows, tl.sum(tl.sum(acc1, axis=2), axis=0).to(ty), mask=row_ok)
    if M > 2:
        tl.store(out_ptr + 2 * N + rows, tl.sum(tl.sum(acc2, axis=2), axis=0).to(ty), mask=row_ok)
    if M > 3:
        tl.store(out_ptr + 3 * N + rows, tl.sum(tl.sum(acc3, axis=2), axis=0).to(ty), mask=row_ok)


# format -> (kernel, plane names in the kernel's argument order)
ROWS_KERNELS = {
    "q4_k": (q4_k_rows_kernel, ("qs", "scales", "d", "dmin")),
}
ROWS_MAX_M = 4
