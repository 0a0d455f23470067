"""The float arithmetic both kernels share, one @triton.jit helper per step: a block's fp32 term from its exact
integer sum, and the add into the running sum. The GEMV (gemv_kernel.py) and the GEMM (gemm_kernel.py) call these
same helpers on operands of the same values (README.md, "Why the bits agree"), so a row's output is the same
sequence of IEEE operations in both.

Each multiply, add and subtract is written as its own rounded operation. With ASM (the GPU) it is inline PTX with
an explicit rounding modifier (`mul.rn.f32`, `add.rn.f32`, `sub.rn.f32`): the PTX ISA lets ptxas fuse a `mul` and
an `add` *without* a rounding modifier into an FMA, never ones with it, and LLVM cannot see into inline assembly,
so no compiler setting (Triton's `enable_fp_fusion`, XLA's LLVM options, ptxas `--fmad`) and no difference in the
code around the two kernels can contract one kernel's term into an FMA and not the other's. Without ASM (Triton's
CPU interpreter, numpy) the plain operators are already one rounding each. Operands are fp32; no `.ftz`, so
subnormals are kept in both kernels (and in numpy).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemm.tiles import q4_k_scale_min


@triton.jit
def mul_rn(a, b, ASM: tl.constexpr):
    """a * b rounded to fp32 on its own (broadcasting)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return a * b


@triton.jit
def add_rn(a, b, ASM: tl.constexpr):
    """a + b rounded to fp32 on its own."""
    if ASM:
        return tl.inline_asm_elementwise(
            "add.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return a + b


@triton.jit
def sub_rn(a, b, ASM: tl.constexpr):
    """a - b rounded to fp32 on its own."""
    if ASM:
        return tl.inline_asm_elementwise(
            "sub.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return a - b


@triton.jit
def q4_k_term(scale, minimum, dx, sx, isum, ASM: tl.constexpr):
    """A Q4_K block's term: ((d sc) * dx) * float(isum) - (dmin m) * sx. scale = d sc and minimum = dmin m
    [1, BLOCK_N] (exact products), dx and sx [rows, 1], isum int32 [rows, BLOCK_N] (|isum| < 2**16: its float is
    exact) -> fp32 [rows, BLOCK_N]."""
    scaled = mul_rn(mul_rn(scale, dx, ASM), isum.to(tl.float32), ASM)
    return sub_rn(scaled, mul_rn(minimum, sx, ASM), ASM)


@triton.jit
def q6_k_term(d, dx, isum, ASM: tl.constexpr):
    """A Q6_K block's term: (d * dx) * float(isum), d [1, BLOCK_N] the super-block scale, dx [rows, 1], isum int32
    [rows, BLOCK_N] = sc_0 half_0 + sc_1 half_1 (|isum| < 2**24: its float is exact) -> fp32 [rows, BLOCK_N]."""
    return mul_rn(mul_rn(d, dx, ASM), isum.to(tl.float32), ASM)


@triton.jit
def q4_k_factors(s0, s1, s2, d, dmin, n):
    """(d sc, dmin m) of sub-block n (int32, a scalar or a tensor) from the super-block's 12 packed scale bytes
    (s0, s1, s2 uint32 words, gguf_gemm/tiles.py's decoder) and d / dmin (fp32): exact products (fp16 times 6
    bits)."""
    sc, mn = q4_k_scale_min(s0, s1, s2, n)
    return d * sc.to(tl.float32), dmin * mn.to(tl.float32)
