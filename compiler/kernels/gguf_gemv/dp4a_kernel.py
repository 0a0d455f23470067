"""Q4_K and Q6_K GEMV on int8 activations (gguf_gemv/act_quant.py): integer dot products with `dp4a`, the "dp4a" variant.

The frame is the rows kernel's (gguf_gemv/rows_kernel.py: grid (cdiv(out, BLOCK_N), SPLIT_K), a program walks its
split's super-blocks S at a time, one 4-D load [S, BLOCK_N, 8, 4] of code words with the next step's
loads issued first, no masks when EXACT), and groups of R activation rows (R <= dp4a.DP4A_MAX_ROWS = 8,
one accumulator each) side by side on grid axis 0: every row of a group reuses the codes the program decoded.

Per code word (8 weights of one row): lo = word & 0x0F0F0F0F and hi = (word >> 4) & 0x0F0F0F0F are 4
unsigned bytes each (layout.py / gguf_gemv/act_quant.py: Q4_K elements q, q+8, q+16, q+24 and q+4, ..., q+28 of a
32-element sub-block; Q6_K elements 4j + q of the sub-blocks 2n and 2n + 1, with qh's two high bits OR-ed in
at bits 4..5 of each byte), and per activation row two dp4a against the matching int8 words add the 8
products into an int32. The 4 words of a block (one thread's 16-byte vector) sum in registers; per block
and row Q4_K adds (d sc) * (dx * float(sum)) - (dmin m) * sx, Q6_K per half h (d sc_h) * dx *
float(sum_h - 32 s_h). That is ~3-7 + 2 R instructions per 8 weights where the float kernels spend ~8 + 8 R.

Precision: the integer sums are exact; what differs from the float GEMV is only x's int8 rounding
(|error| <= dx / 2 per element, dx = max |x| / 127 over its block of 32), as in ggml's CUDA decode. With
TERMS = 2 (gguf_gemv/act_quant.py) a second int8 term of the residual adds two dp4a per word and activation row, and
the error falls to dx' / 2 <= dx / 254.
ASM=False (Triton's CPU interpreter has no inline PTX) computes dp4a with shifts and multiplies.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.dp4a_body import dp4a_gemv_body


@triton.jit
def dp4a_gemv_kernel(
    qa_ptr,
    da_ptr,
    p0,
    p1,
    p2,
    p3,
    out_ptr,
    M_PAD: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
    UNITS_PER_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,
    EXACT: tl.constexpr,
    Q6: tl.constexpr,
    ACT_Q4: tl.constexpr,
    ASM: tl.constexpr,
    TERMS: tl.constexpr = 1,
):
    """qa int32 [M_PAD, TERMS K/4], da float32 [M_PAD, K/32, 4 TERMS] (gguf_gemv/act_quant.py, packed for the format, or for Q4_K
    when ACT_Q4 on a Q6_K weight) and the
    planes p0..p3 (Q4_K: qs, scales, d, dmin; Q6_K when Q6: ql, qh, scales, d) -> out [SPLIT_K, M_PAD, N].
    Grid axis 0 = row tile * GROUPS + g: the programs of one weight tile are launched together, so the
    row groups after the first read the tile from L2, not HBM. Program g takes rows g R .. g R + R - 1."""
    dp4a_gemv_body(
        qa_ptr,
        da_ptr,
        p0,
        p1,
        p2,
        p3,
        out_ptr,
        out_ptr,
        out_ptr,
        out_ptr,
        M_PAD,
        N,
        K,
        R,
        BLOCK_N,
        S,
        UNITS_PER_SPLIT,
        PREFETCH,
        EXACT,
        Q6,
        ACT_Q4,
        ASM,
        N,
        N,
        False,
        0,
        0,
        TERMS,
    )


@triton.jit
def dp4a_gemv_parts_kernel(
    qa_ptr,
    da_ptr,
    p0,
    p1,
    p2,
    p3,
    bias_ptr,
    out_ptr,
    out2_ptr,
    out3_ptr,
    M_PAD: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
    UNITS_PER_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr,
    EXACT: tl.constexpr,
    Q6: tl.constexpr,
    ACT_Q4: tl.constexpr,
    ASM: tl.constexpr,
    N1: tl.constexpr,
    N2: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_OFFSET: tl.constexpr,
    TERMS: tl.constexpr = 1,
):
    """dp4a_gemv_kernel for a weight packing up to 3 projections (q / k / v) and one split along `in`: their
    outputs go apart, out [M_PAD, N1], out2 [M_PAD, N2 - N1], out3 [M_PAD, N - N2] (N2 = N: two parts), each
    plus its bias bias[BIAS_OFFSET + row] when HAS_BIAS, so that no slice or bias kernel follows the GEMV."""
    dp4a_gemv_body(
        qa_ptr,
        da_ptr,
        p0,
        p1,
        p2,
        p3,
        bias_ptr,
        out_ptr,
        out2_ptr,
        out3_ptr,
        M_PAD,
        N,
        K,
        R,
        BLOCK_N,
        S,
        UNITS_PER_SPLIT,
        PREFETCH,
        EXACT,
        Q6,
        ACT_Q4,
        ASM,
        N1,
        N2,
        HAS_BIAS,
        BIAS_OFFSET,
        0,
        TERMS,
    )


@triton.jit
def dp4a_gemv_pair_kernel(
    qa_ptr,
    da_ptr,
    a0,
    a1,
    a2,
    a3,
    b0,
    b1,
    b2,
    b3,
    bias_ptr,
    out_ptr,
    out2_ptr,
    out3_ptr,
    M_PAD: tl.constexpr,
    K: tl.constexpr,
    R: tl.constexpr,
    NA: tl.constexpr,
    N1: tl.constexpr,
    NB: tl.constexpr,
    TILES_A: tl.constexpr,
    BLOCK_N_A: tl.constexpr,
    S_A: tl.constexpr,
    PREFETCH_A: tl.constexpr,
    EXACT_A: tl.constexpr,
    BLOCK_N_B: tl.constexpr,
    S_B: tl.constexpr,
    PREFETCH_B: tl.constexpr,
    EXACT_B: tl.constexpr,
    Q6_B: tl.constexpr,
    ASM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_OFFSET: tl.constexpr,
    TERMS: tl.constexpr = 1,
):
    """The parts kernel over two weights of one input in one launch (one split each): a Q4_K weight A [NA, K]
    packing one or two projections (rows [0, N1) -> out [M_PAD, N1], [N1, NA) -> out2) and a Q6_K (or Q4_K)
    weight B [NB, K] (-> out3 [M_PAD, NB]), e.g. a Q4_K q+k beside a Q6_K v. The first TILES_A row tiles of
    grid axis 0 are A's, the rest B's; B reads A's Q4_K activation packing (Q6_B: permuted for Q6_K, ACT_Q4).
    The bias is one vector over A's rows then B's (bias[BIAS_OFFSET + row])."""
    if tl.program_id(0) // (M_PAD // R) < TILES_A:
        dp4a_gemv_body(
            qa_ptr,
            da_ptr,
            a0,
            a1,
            a2,
            a3,
            bias_ptr,
            out_ptr,
            out2_ptr,
            out2_ptr,
            M_PAD,
            NA,
            K,
            R,
            BLOCK_N_A,
            S_A,
            K // 256,
            PREFETCH_A,
            EXACT_A,
            False,
            False,
            ASM,
            N1,
            NA,
            HAS_BIAS,
            BIAS_OFFSET,
            0,
            TERMS,
        )
    else:
        dp4a_gemv_body(
            qa_ptr,
            da_ptr,
            b0,
            b1,
            b2,
            b3,
            bias_ptr,
            out3_ptr,
            out3_ptr,
            out3_ptr,
            M_PAD,
            NB,
            K,
            R,
            BLOCK_N_B,
            S_B,
            K // 256,
            PREFETCH_B,
            EXACT_B,
            Q6_B,
            Q6_B,
            ASM,
            NB,
            NB,
            HAS_BIAS,
            BIAS_OFFSET + NA,
            TILES_A,
            TERMS,
        )


# format -> the planes in the kernel's p0..p3 order
DP4A_PLANES = {"q4_k": ("qs", "scales", "d", "dmin"), "q6_k": ("ql", "qh", "scales", "d")}
