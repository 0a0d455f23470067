"""act_quant.quantize_activations as one Triton kernel: the dp4a GEMV's int8 activations in one launch.

XLA splits the jnp version into a reduction, a transposing fusion and a concatenation (measured on the H200:
~9 kernels per layer for the 4 projection inputs, ~350 us per 1.5B decode step, as much as dp4a saved), so
the GEMV's caller runs this instead: grid (m, cdiv(k / 32, BLOCKS)), each program quantizes BLOCKS blocks of
32 elements of one row and writes their packed words and (dx, sx).

Bit-equal to the jnp reference where it matters: inv = 127 / max|x| and dx = max|x| / 127 are IEEE
divisions (div_rn), q = rint(x * inv) (cvt.rni: a single rounding of the product, no FMA contraction
possible), and the packing is the documented one. sx is summed in a different order (fp32 rounding only).
ASM=False (Triton's CPU interpreter, numpy, no contraction) rounds with the 1.5 * 2**23 trick instead.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rint(v, ASM: tl.constexpr):
    """Round to nearest, ties to even -> int32 (|v| <= 127 here)."""
    if ASM:
        return tl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=True,
                                         pack=1)
    else:
        return ((v + 12582912.0) - 12582912.0).to(tl.int32)


@triton.jit
def quantize_rows_kernel(x_ptr, qa_ptr, da_ptr, K: tl.constexpr, BLOCKS: tl.constexpr, ASM: tl.constexpr):
    """x [m, K] -> qa int32 [m, K/4], da float32 [m, K/32, 2]; program (row, p) takes blocks p BLOCKS ..."""
    row = tl.program_id(0)
    blocks = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    ok = blocks < K // 32
    j3 = tl.arange(0, 4)[None, :, None]                   # byte of the packed word
    w3 = tl.arange(0, 8)[None, None, :]                   # word of the block: 4 h + q
    b3 = blocks[:, None, None]
    x = tl.load(x_ptr + row * K + b3 * 32 + 8 * j3 + w3, mask=ok[:, None, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)     # [BLOCKS]
    total = tl.sum(tl.sum(x, axis=2), axis=1)
    inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax), 0.0)
    q = _rint(x * inv[:, None, None], ASM)               # [BLOCKS, 4, 8] in [-127, 127]
    words = tl.sum((q & 255) << (8 * j3), axis=1)        # disjoint bytes: the sum is the OR
    tl.store(qa_ptr + row * (K // 4) + blocks[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=ok[:, None])
    dx = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    scales = da_ptr + (row * (K // 32) + blocks) * 2
    tl.store(scales, dx, mask=ok)
    tl.store(scales + 1, total, mask=ok)


QUANTIZE_BLOCKS = 16  # activation blocks (of 32) per program


def quantize_plan(m: int, k: int) -> dict:
    return {"grid": (m, -(-(k // 32) // QUANTIZE_BLOCKS), 1), "meta": dict(K=k, BLOCKS=QUANTIZE_BLOCKS)}
