"""Row-tile GEMV kernels for decode (m <= 4 activation rows), the "rows" variant of QuantMatmulConfig.

The grid, split-K ranges and outputs are gguf_gemv/rows_common.py's frame; this module holds the Q4_K
kernel and the registry ROWS_KERNELS (Q6_K: gguf_gemv/rows_q6_k.py, Q8_0 and Q5_0: gguf_gemv/rows_q8_0.py).

Why this shape (decode reads each weight once, and the kernel must decode 4-bit codes as fast as HBM
delivers them: at ~1e12 weights/s the H200's ~3.4e13 lane operations/s leave ~30 per weight across the
chip, but a single program sees only its share, so every operation per weight counts):
  - split-K (grid axis 1) and small row tiles (BLOCK_N down to 4) give enough programs when `out` is
    small and `in` long (e.g. 1536 x 8960: 35 super-blocks per row would otherwise serialise);
  - a loop step loads S super-blocks as ONE 4-D load [S, BLOCK_N, 8, 4] of u32 words (sub-block n, word q;
    the block-major layout makes each [BLOCK_N, 32] slab contiguous), and PREFETCH issues the next step's
    loads before this step's math (a register double buffer);
  - layout.py puts one sub-block in 4 consecutive words (element 32n + 4i + q at nibble i of word 4n + q),
    so a thread's 16-byte vector is one sub-block of one row: its 6-bit scale and min are decoded once per
    32 weights (on [S, BLOCK_N, 8, 1] tensors), and nibble i of the 4 words is 4 consecutive activations;
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

from ember.compiler.kernels.gguf_gemv.rows_common import (
    accumulate_rows,
    block_frame,
    field_to,
    load_where,
    plane_index,
    store_rows,
    u2f,
)
from ember.compiler.kernels.gguf_gemv.rows_q6_k import q6_k_rows_kernel
from ember.compiler.kernels.gguf_gemv.rows_q8_0 import q5_0_rows_kernel, q8_0_rows_kernel


@triton.jit
def q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u4, stop, r4, row_ok4, w4, N: tl.constexpr, EXACT: tl.constexpr):
    """Planes of super-blocks u4 [S, 1, 1, 1] for the tile: words [S, BLOCK_N, 8, 4], the rest [S, BLOCK_N, 1, 1].
    EXACT: no masks (no zero-filled registers, no predicates; plane_index clamps instead)."""
    plane = plane_index(u4, stop, r4, N, EXACT)
    ok = (u4 < stop) & row_ok4  # (unused when EXACT)
    masked: tl.constexpr = not EXACT
    words = load_where(qs_ptr + plane * 32 + w4, ok, masked)
    s0 = load_where(scales_ptr + plane * 3, ok, masked)
    s1 = load_where(scales_ptr + plane * 3 + 1, ok, masked)
    s2 = load_where(scales_ptr + plane * 3 + 2, ok, masked)
    d = load_where(d_ptr + plane, ok, masked).to(tl.float32)
    dmin = load_where(dmin_ptr + plane, ok, masked).to(tl.float32)
    return words, s0, s1, s2, d, dmin


@triton.jit
def q4_k_sub_scales(s0, s1, s2, d, dmin, n4):
    """(d sc, dmin m) of sub-blocks n4 [1, 1, 8, 1] -> float32 [S, BLOCK_N, 8, 1] each (exact products).
    GGUF's 12 bytes: bytes 0..3 hold sc (low 6 bits) of sub-blocks 0..3, bytes 4..7 their mins; for
    n >= 4, byte 8 + n - 4 holds the low 4 bits of sc and min, bits 6..7 of byte n - 4 (4 + n - 4) the high 2."""
    shift = (n4 % 4) * 8
    b0 = s0 >> shift
    b1 = s1 >> shift
    b2 = s2 >> shift
    low = n4 < 4
    sc = tl.where(low, b0 & 63, (b2 & 15) | ((b0 >> 2) & 48))
    mn = tl.where(low, b1 & 63, ((b2 >> 4) & 15) | ((b1 >> 2) & 48))
    return d * u2f(sc), dmin * u2f(mn)


@triton.jit
def _q4_k_scales(s0, s1, s2, d, dmin, n4):
    """(s, u) = (16 d sc, 16 d sc + dmin m), float32 [S, BLOCK_N, 8, 1] each (16 d sc exact: a power of two)."""
    scale, minimum = q4_k_sub_scales(s0, s1, s2, d, dmin, n4)
    s = scale * 16.0
    return s, s + minimum


@triton.jit
def q4_k_rows_kernel(
    x_ptr,
    qs_ptr,
    scales_ptr,
    d_ptr,
    dmin_ptr,
    out_ptr,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
    UNITS_PER_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,
    EXACT: tl.constexpr,
):
    """EXACT (matmul.py _rows_plan): every split's range is whole steps of S units, so no step is partly
    outside it and nothing needs a mask; the loop runs over this split's own step count."""
    rows, row_ok, r4, row_ok4, pid_k, start, stop, u0, n4, q4, w4 = block_frame(
        tl.program_id(0), BLOCK_N, N, S, UNITS_PER_SPLIT, K
    )  # word of (sub-block n, q)
    e4 = n4 * 32 + q4  # its element at nibble 0 (nibble i: + 4 i)
    # 1.0's bits, in a register: grid axis 2 has one program, but the compiler cannot know, so it keeps
    # `one` in a register and (c & mask) | one becomes ONE LOP3 (with two immediates it emits two)
    one = 0x3F800000 | tl.program_id(2)
    acc0 = tl.zeros((S, BLOCK_N, 8, 4), tl.float32)  # one accumulator per activation row, reduced at the end
    acc1 = tl.zeros((S, BLOCK_N, 8, 4), tl.float32)
    acc2 = tl.zeros((S, BLOCK_N, 8, 4), tl.float32)
    acc3 = tl.zeros((S, BLOCK_N, 8, 4), tl.float32)
    if EXACT:
        nsteps = (stop - start) // S
    else:
        nsteps = (UNITS_PER_SPLIT + S - 1) // S
    nxt = q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u0, stop, r4, row_ok4, w4, N, EXACT)
    for step in range(nsteps):
        u4 = u0 + step * S
        words, s0, s1, s2, d, dmin = nxt
        if PREFETCH:  # the next step's loads go out before this step's math (past the range: masked/clamped)
            nxt = q4_k_load(qs_ptr, scales_ptr, d_ptr, dmin_ptr, u4 + S, stop, r4, row_ok4, w4, N, EXACT)
        else:
            words, s0, s1, s2, d, dmin = q4_k_load(
                qs_ptr, scales_ptr, d_ptr, dmin_ptr, u4, stop, r4, row_ok4, w4, N, EXACT
            )
        ok_u = u4 < stop
        s, u = _q4_k_scales(s0, s1, s2, d, dmin, n4)  # [S, BLOCK_N, 8, 1]
        for i in tl.static_range(8):
            v = (field_to(words, 4 * i, 19, 0x00780000) | one).to(tl.float32, bitcast=True)  # 1 + c/16
            w = s * v - u  # [S, BLOCK_N, 8, 4] = d sc c - dmin m
            acc0, acc1, acc2, acc3 = accumulate_rows(
                acc0, acc1, acc2, acc3, w, x_ptr, u4, ok_u, 4 * i, e4, K, 256, M, not EXACT
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


# format -> (kernel, plane names in the kernel's argument order); the plans: matmul.py _rows_plan
ROWS_KERNELS = {
    "q4_k": (q4_k_rows_kernel, ("qs", "scales", "d", "dmin")),
    "q6_k": (q6_k_rows_kernel, ("ql", "qh", "scales", "d")),
    "q8_0": (q8_0_rows_kernel, ("qs", "d")),
    "q5_0": (q5_0_rows_kernel, ("qs", "qh", "d")),
}
