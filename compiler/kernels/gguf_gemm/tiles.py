"""Triton tile decoders: one K-tile of a GGUF-packed weight (layouts in compiler/kernels/gguf_gemv/layout.py)
dequantized to fp32 in registers, [BLOCK_N, SUB * 32] for output rows `rows` and the SUB consecutive
32-element groups that start at element k0 (a K-quant tile never crosses its 256-element super-block).

Every decoder orders a tile's columns as the elements k0, k0 + 1, ... so the GEMM multiplies it with the
activations' columns as they lie in memory: the layouts' in-block permutations are undone by the shapes of
the 4-D [BLOCK_N, SUB, 8, 4] / 3-D [BLOCK_N, SUB, 32] tensors, not by gathers. `rows` must already be
clamped to the matrix (the loads are unmasked); the GEMM masks its stores instead.

Each value is computed as the jnp reference does (gguf_gemv/reference.py): the scale product in fp32
(exact), times the code, minus the minimum; the GEMM rounds it once to the activation dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def q4_k_scale_min(s0, s1, s2, n):
    """6-bit scale and min of sub-blocks n ([1, SUB] int32, or one scalar) from the 12 packed bytes (s0, s1, s2 [BLOCK_N, 1]
    uint32 words) -> uint32 [BLOCK_N, SUB] each."""
    low = n < 4
    shift = (8 * (n % 4)).to(tl.uint32)
    sc = tl.where(low, (s0 >> shift) & 63, ((s2 >> shift) & 15) | (((s0 >> (shift + 6)) & 3) << 4))
    mn = tl.where(low, (s1 >> shift) & 63, ((s2 >> (shift + 4)) & 15) | (((s1 >> (shift + 6)) & 3) << 4))
    return sc, mn


@triton.jit
def q4_k_tile(qs_ptr, scales_ptr, d_ptr, dmin_ptr, k0, rows, N: tl.constexpr, SUB: tl.constexpr):
    """Q4_K: word 4n + q of a super-block holds element 32n + 4i + q at nibble i."""
    BLOCK_N: tl.constexpr = rows.shape[0]
    plane = (k0 // 256) * N + rows[:, None]  # [BLOCK_N, 1] index into [in/256, out] planes
    n = (k0 % 256) // 32 + tl.arange(0, SUB)[None, :]  # [1, SUB] sub-blocks
    s0 = tl.load(scales_ptr + plane * 3)
    s1 = tl.load(scales_ptr + plane * 3 + 1)
    s2 = tl.load(scales_ptr + plane * 3 + 2)
    sc, mn = q4_k_scale_min(s0, s1, s2, n)
    scale = tl.load(d_ptr + plane).to(tl.float32) * sc.to(tl.float32)  # [BLOCK_N, SUB]
    minimum = tl.load(dmin_ptr + plane).to(tl.float32) * mn.to(tl.float32)
    q = tl.arange(0, 4)[None, None, None, :]
    i = tl.arange(0, 8)[None, None, :, None]
    words = tl.load(qs_ptr + plane[:, :, None, None] * 32 + 4 * n[:, :, None, None] + q)  # [BLOCK_N, SUB, 1, 4]
    codes = ((words >> (4 * i).to(tl.uint32)) & 15).to(tl.float32)  # [BLOCK_N, SUB, 8 (i), 4 (q)]
    values = scale[:, :, None, None] * codes - minimum[:, :, None, None]
    return tl.reshape(values, (BLOCK_N, SUB * 32))


@triton.jit
def q6_k_tile(ql_ptr, qh_ptr, scales_ptr, d_ptr, k0, rows, N: tl.constexpr, SUB: tl.constexpr):
    """Q6_K: ql word 4n + q holds element 32n + 16h + 4j + q at nibble 2j + h, qh word 2n + h its high bits
    at 8j + 2q, scale 2n + h its sub-block's. Axis 2 of the 4-D tile is 4h + j (so element 32n + 4(4h + j) + q)."""
    BLOCK_N: tl.constexpr = rows.shape[0]
    plane = ((k0 // 256) * N + rows)[:, None, None, None]  # [BLOCK_N, 1, 1, 1]
    n = ((k0 % 256) // 32 + tl.arange(0, SUB))[None, :, None, None]  # [1, SUB, 1, 1]
    hj = tl.arange(0, 8)[None, None, :, None]
    h = hj // 4
    j = hj % 4
    q = tl.arange(0, 4)[None, None, None, :]
    ql = tl.load(ql_ptr + plane * 32 + 4 * n + q)  # [BLOCK_N, SUB, 1, 4]
    qh = tl.load(qh_ptr + plane * 16 + 2 * n + h)  # [BLOCK_N, SUB, 8, 1]
    low = (ql >> (4 * (2 * j + h)).to(tl.uint32)) & 15
    high = (qh >> (8 * j + 2 * q).to(tl.uint32)) & 3
    codes = (low | (high << 4)).to(tl.int32) - 32  # [BLOCK_N, SUB, 8, 4] in -32..31
    scale = tl.load(d_ptr + plane).to(tl.float32) * tl.load(scales_ptr + plane * 16 + 2 * n + h).to(tl.float32)
    return tl.reshape(scale * codes.to(tl.float32), (BLOCK_N, SUB * 32))


@triton.jit
def q8_0_tile(qs_ptr, d_ptr, k0, rows, N: tl.constexpr, SUB: tl.constexpr):
    """Q8_0: SUB blocks of 32 int8 codes, one fp16 scale each."""
    BLOCK_N: tl.constexpr = rows.shape[0]
    plane = (k0 // 32 + tl.arange(0, SUB))[None, :, None] * N + rows[:, None, None]  # [BLOCK_N, SUB, 1]
    codes = tl.load(qs_ptr + plane * 32 + tl.arange(0, 32)[None, None, :]).to(tl.float32)
    return tl.reshape(tl.load(d_ptr + plane).to(tl.float32) * codes, (BLOCK_N, SUB * 32))


@triton.jit
def q5_0_tile(qs_ptr, qh_ptr, d_ptr, k0, rows, N: tl.constexpr, SUB: tl.constexpr):
    """Q5_0: byte l holds the low 4 bits of elements l (low nibble) and l + 16; bit j of qh element j's 5th."""
    BLOCK_N: tl.constexpr = rows.shape[0]
    plane = (k0 // 32 + tl.arange(0, SUB))[None, :, None] * N + rows[:, None, None]  # [BLOCK_N, SUB, 1]
    e = tl.arange(0, 32)[None, None, :]
    byte = tl.load(qs_ptr + plane * 16 + e % 16).to(tl.int32)
    high = (tl.load(qh_ptr + plane) >> e.to(tl.uint32)) & 1
    codes = ((byte >> (4 * (e // 16))) & 15) | (high.to(tl.int32) << 4)
    return tl.reshape(tl.load(d_ptr + plane).to(tl.float32) * (codes - 16).to(tl.float32), (BLOCK_N, SUB * 32))
