"""act_quant.quantize_activations as one Triton kernel: the dp4a GEMV's int8 activations in one launch.

XLA splits the jnp version into a reduction, a transposing fusion and a concatenation (measured on the H200:
~9 kernels per layer for the 4 projection inputs, ~350 us per 1.5B decode step, as much as dp4a saved), so
the GEMV's caller runs this instead: grid (m, cdiv(k / 32, BLOCKS)), each program quantizes BLOCKS blocks of
32 elements of one row and writes their packed words (in the weight format's order) and (dx, sx, s0, s1).

Bit-equal to the jnp reference where it matters: inv = 127 / max|x| and dx = max|x| / 127 are IEEE
divisions (div_rn), q = rint(x * inv) (cvt.rni: a single rounding of the product, no FMA contraction
possible), and the packing is the documented one. sx is summed in a different order (fp32 rounding only).
ASM=False (Triton's CPU interpreter, numpy, no contraction) rounds with the 1.5 * 2**23 trick instead.
TERMS = 2 (act_quant.act_terms) writes a second term for the residual x - dx q, the product rounded once
(mul.rn: no FMA may fuse it with the subtraction, as the reference's separate ops do not).

With SILU_GATED the kernel reads a gate/up projection's output and quantizes silu(gate) * up: the down
projection's activation costs no kernel of its own (linear_quant.gated_linear, the fuse_gated_linear pass).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.int_invariant.terms import mul_rn  # one rounding, never contracted into an FMA


@triton.jit
def _rint(v, ASM: tl.constexpr):
    """Round to nearest, ties to even -> int32 (|v| <= 127 here)."""
    if ASM:
        return tl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)
    else:
        return ((v + 12582912.0) - 12582912.0).to(tl.int32)


@triton.jit
def _silu_times(g_ptr, u_ptr, mask):
    """silu(g) * u as the jnp reference computes it in g's dtype: sigmoid, times g, times u, each result
    rounded to that dtype (XLA's elementwise ops on bf16 round every op's result) -> float32."""
    dtype = g_ptr.dtype.element_ty
    g = tl.load(g_ptr, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g).to(dtype).to(tl.float32)
    return ((g * s).to(dtype).to(tl.float32) * u).to(dtype).to(tl.float32)


@triton.jit
def packed_order(Q6: tl.constexpr):
    """(j3 [1, 4, 1] byte of a packed word, e3 [1, 4, 8] element of a 32-block each (byte, word) holds)."""
    j3 = tl.arange(0, 4)[None, :, None]  # byte of the packed word
    w3 = tl.arange(0, 8)[None, None, :]  # word of the block: 4 h + q
    if Q6:
        e3 = 16 * (w3 // 4) + 4 * j3 + w3 % 4  # element 16h + 4j + q
    else:
        e3 = 8 * j3 + w3  # element 8j + 4h + q
    return j3, e3


@triton.jit
def quantize_store(
    x, qa_ptr, da_ptr, row, blocks, ok, j3, e3, K: tl.constexpr, ASM: tl.constexpr, TERMS: tl.constexpr = 1
):
    """x [BLOCKS, 4, 8] fp32 (blocks `blocks` of activation row `row`, laid out by packed_order) -> their
    packed int8 words in qa [m, TERMS K/4] and per term (dx, sx, s0, s1) in da [m, K/32, 4 TERMS] (term t's
    words at t K/4 of the row, its factors at 4 t of the block; sx in the first term only); blocks where not
    ok skipped."""
    total = tl.sum(tl.sum(x, axis=2), axis=1)
    for t in tl.static_range(TERMS):
        amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)  # [BLOCKS]
        inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax), 0.0)
        q = _rint(x * inv[:, None, None], ASM)  # [BLOCKS, 4, 8] in [-127, 127]
        words = tl.sum((q & 255) << (8 * j3), axis=1)  # disjoint bytes: the sum is the OR
        tl.store(
            qa_ptr + row * (TERMS * K // 4) + t * (K // 4) + blocks[:, None] * 8 + tl.arange(0, 8)[None, :],
            words,
            mask=ok[:, None],
        )
        upper = tl.sum(tl.sum(tl.where(e3 >= 16, q, 0), axis=2), axis=1)  # sum of q over elements 16..31
        lower = tl.sum(tl.sum(q, axis=2), axis=1) - upper
        dx = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
        scales = da_ptr + (row * (K // 32) + blocks) * (4 * TERMS) + 4 * t
        tl.store(scales, dx, mask=ok)
        tl.store(scales + 1, total if t == 0 else tl.zeros_like(total), mask=ok)
        tl.store(scales + 2, lower.to(tl.float32), mask=ok)
        tl.store(scales + 3, upper.to(tl.float32), mask=ok)
        if t + 1 < TERMS:
            x = x - mul_rn(q.to(tl.float32), dx[:, None, None], ASM)


@triton.jit
def quantize_rows_kernel(
    x_ptr,
    qa_ptr,
    da_ptr,
    K: tl.constexpr,
    BLOCKS: tl.constexpr,
    Q6: tl.constexpr,
    ASM: tl.constexpr,
    SILU_GATED: tl.constexpr = False,
    TERMS: tl.constexpr = 1,
):
    """x [m, K] -> qa int32 [m, K/4] (packed for Q4_K, or for Q6_K when Q6), da float32 [m, K/32, 4];
    program (row, p) takes blocks p BLOCKS ... p BLOCKS + BLOCKS - 1. SILU_GATED: x is [m, 2K], gate then up
    (a packed gate/up projection's output), and what is quantized is silu(gate) * up (activation.py)."""
    row = tl.program_id(0)
    blocks = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    ok = blocks < K // 32
    j3, e3 = packed_order(Q6)
    cols = blocks[:, None, None] * 32 + e3
    if SILU_GATED:
        x = _silu_times(x_ptr + row * 2 * K + cols, x_ptr + row * 2 * K + K + cols, ok[:, None, None])
    else:
        x = tl.load(x_ptr + row * K + cols, mask=ok[:, None, None], other=0.0)
        x = x.to(tl.float32)  # [BLOCKS, 4, 8]
    quantize_store(x, qa_ptr, da_ptr, row, blocks, ok, j3, e3, K, ASM, TERMS)


QUANTIZE_BLOCKS = 16  # activation blocks (of 32) per program


def quantize_plan(m: int, k: int, order: str = "q4_k", silu_gated: bool = False) -> dict:
    """Grid and constexprs for x [m, k] packed for `order` (act_quant.PACKINGS: "q4_k" or "q6_k"); with
    silu_gated, for silu(gate) * up of a [m, 2k] gate/up output."""
    if order not in ("q4_k", "q6_k"):
        raise ValueError(f"no activation packing for {order!r}")
    from ember.compiler.kernels.gguf_gemv.act_quant import act_terms

    return {
        "grid": (m, -(-(k // 32) // QUANTIZE_BLOCKS), 1),
        "meta": dict(K=k, BLOCKS=QUANTIZE_BLOCKS, Q6=order == "q6_k", SILU_GATED=silu_gated, TERMS=act_terms()),
    }
