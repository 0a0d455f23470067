"""Triton kernel: x [m, K] -> the int8 activations both the GEMV and the GEMM read (reference.py quantize_rows and
pack_words, the same bits): qa int32 [m, K/4] (the Q4_K word packing; its bytes are the GEMM's int8 tiles),
dx and sx float32 [m, K/32].

Grid (m, cdiv(K/32, BLOCKS)): program (row, p) quantizes blocks p BLOCKS .. p BLOCKS + BLOCKS - 1 of one row, so
a row's values never depend on the other rows or on m. Bit-equal to the jnp form by construction:
  - amax is a max (exact in any order); inv = 127 / amax is an IEEE division (div_rn), dx = amax * fp32(1/127)
    one rounded multiply (reference.py, 1.);
  - q = rint(x * inv): with ASM `cvt.rni.s32.f32` of the product (round to nearest even, one rounding of the
    product: a conversion cannot be contracted into an FMA); without (the interpreter, numpy) the 1.5 * 2**23 trick;
  - sx adds the block's 32 values in fixed_order_sum's tree (e with e + 16, then the 16 sums' e with e + 8, ...),
    spelled out as reshape / permute / split / add, not tl.sum (whose order is the compiler's).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .reference import RECIP_127

QUANTIZE_BLOCKS = 16  # activation blocks (of 32) per program
_RECIP_127 = tl.constexpr(RECIP_127)  # an fp32 value: the kernel's constant is exactly it


@triton.jit
def _rint(v, ASM: tl.constexpr):
    """Round to nearest, ties to even -> int32 (|v| <= 127 here)."""
    if ASM:
        return tl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)
    else:
        return ((v + 12582912.0) - 12582912.0).to(tl.int32)


@triton.jit
def _halve(t, BLOCKS: tl.constexpr, WIDTH: tl.constexpr):
    """[BLOCKS, WIDTH] -> [BLOCKS, WIDTH / 2]: element e plus element e + WIDTH / 2."""
    pairs = tl.permute(tl.reshape(t, (BLOCKS, 2, WIDTH // 2)), (0, 2, 1))  # [BLOCKS, WIDTH / 2, 2]
    low, high = tl.split(pairs)
    return low + high


@triton.jit
def fixed_order_block_sum(x, BLOCKS: tl.constexpr):
    """x [BLOCKS, 32] fp32 -> [BLOCKS]: compiler/kernels/fixed_order.py's fixed_order_sum over the last axis."""
    t = _halve(x, BLOCKS, 32)
    t = _halve(t, BLOCKS, 16)
    t = _halve(t, BLOCKS, 8)
    t = _halve(t, BLOCKS, 4)
    t = _halve(t, BLOCKS, 2)
    return tl.reshape(t, (BLOCKS,))


@triton.jit
def quantize_kernel(x_ptr, qa_ptr, dx_ptr, sx_ptr, K: tl.constexpr, BLOCKS: tl.constexpr, ASM: tl.constexpr):
    """x [m, K] (bf16 / fp16 / fp32) -> qa int32 [m, K/4], dx float32 [m, K/32], sx float32 [m, K/32]."""
    row = tl.program_id(0).to(tl.int64)
    blocks = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    ok = blocks < K // 32
    x = tl.load(x_ptr + row * K + blocks[:, None] * 32 + tl.arange(0, 32)[None, :], mask=ok[:, None], other=0.0)
    x = x.to(tl.float32)  # [BLOCKS, 32] in element order
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax), 0.0)
    q = _rint(x * inv[:, None], ASM)  # [BLOCKS, 32] in [-127, 127]
    # element e = 8 j + 4 h + c goes to byte j of word 4 h + c (reference.pack_words)
    lanes = tl.permute(tl.reshape(q & 255, (BLOCKS, 4, 2, 4)), (0, 2, 3, 1))  # [BLOCKS, h, c, byte j]
    shifts = 8 * tl.arange(0, 4)[None, None, None, :]
    words = tl.reshape(tl.sum(lanes << shifts, axis=3), (BLOCKS, 8))  # disjoint bytes: the sum is the OR
    tl.store(qa_ptr + row * (K // 4) + blocks[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=ok[:, None])
    dx = amax * _RECIP_127  # a multiply feeding a store: nothing to contract it with
    tl.store(dx_ptr + row * (K // 32) + blocks, dx, mask=ok)
    tl.store(sx_ptr + row * (K // 32) + blocks, fixed_order_block_sum(x, BLOCKS), mask=ok)


def quantize_plan(m: int, k: int, asm: bool) -> dict:
    """Grid and constants of one quantize_kernel call for x [m, k]."""
    return {"grid": (m, -(-(k // 32) // QUANTIZE_BLOCKS), 1), "meta": dict(K=k, BLOCKS=QUANTIZE_BLOCKS, ASM=asm)}
