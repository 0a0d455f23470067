"""The dp4a GEMV's activation prologue: each program makes the int8 activations it reads itself, so the op
that produced the projection's input (an RMSNorm, a residual add + RMSNorm, or SiLU(gate) * up) costs no
launch of its own (dp4a.Prologue says which; triton_gemv_dp4a.py calls act_prologue before its loop).

Every program of a launch computes the activations of its row group over its split's super-blocks and
stores them to the launch's qa / da scratch outputs, then the CTA synchronizes and the loop reads them back
as the plain kernel reads a quantizer's. Programs of different row tiles write the same values to the same
words: the race is benign (every writer stores identical bits, and a program only reads words it wrote
itself first, so it never sees the buffer's uninitialized contents). The norm modes need the row's whole
sum of squares first, read in CHUNK-block passes (a few KB from L2 per program); the SiLU mode reads only
the split's blocks.

Values as norm_quant_gpu.py's fused norm computes them (the sum rounded to the activation dtype, the normed
row rounded once before quantizing), except the sum of squares' order (fp32 rounding only).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_act_quant import _silu_times, packed_order, quantize_store

NONE, NORM, ADD_NORM, SILU = 0, 1, 2, 3  # the prologue modes (constexpr MODE)
CHUNK = tl.constexpr(16)  # activation blocks of 32 per pass


@triton.jit
def _source(x_ptr, y_ptr, row, cols, ok, K: tl.constexpr, MODE: tl.constexpr):
    """Elements `cols` of activation row `row` before the norm's scale -> float32: x (NORM), x + y rounded to
    x's dtype (ADD_NORM, the residual stream), or silu(gate) * up of x = gate_up [m, 2K] (SILU)."""
    if MODE == 3:
        return _silu_times(x_ptr + row * 2 * K + cols, x_ptr + row * 2 * K + K + cols, ok)
    s = tl.load(x_ptr + row * K + cols, mask=ok, other=0.0).to(tl.float32)
    if MODE == 2:
        y = tl.load(y_ptr + row * K + cols, mask=ok, other=0.0).to(tl.float32)
        s = (s + y).to(x_ptr.dtype.element_ty).to(tl.float32)
    return s


@triton.jit
def act_prologue(x_ptr, y_ptr, nw_ptr, qa_ptr, da_ptr, row, start, stop, M: tl.constexpr, K: tl.constexpr,
                 UNITS_PER_SPLIT: tl.constexpr, EPS: tl.constexpr, MODE: tl.constexpr, Q6: tl.constexpr,
                 ASM: tl.constexpr):
    """Activation row `row`'s int8 activations for super-blocks [start, stop) (256 elements each) -> qa
    [M_PAD, K/4], da [M_PAD, K/32, 4]; rows >= M (the plan's padding rows) get zeros."""
    live = row < M
    inv = 1.0
    if MODE != 3:  # RMSNorm: the whole row's statistics first
        squares = 0.0
        for c in tl.static_range((K + CHUNK * 32 - 1) // (CHUNK * 32)):
            span = c * CHUNK * 32 + tl.arange(0, CHUNK * 32)
            s = _source(x_ptr, y_ptr, row, span, live & (span < K), K, MODE)
            squares += tl.sum(s * s, axis=0)
        inv = 1.0 / tl.sqrt(squares / K + EPS)
    j3, e3 = packed_order(Q6)
    for c in range(0, (UNITS_PER_SPLIT * 8 + CHUNK - 1) // CHUNK):
        blocks = start * 8 + c * CHUNK + tl.arange(0, CHUNK)
        ok = blocks < stop * 8
        cols = blocks[:, None, None] * 32 + e3               # [CHUNK, 4, 8] in the packed order
        h = _source(x_ptr, y_ptr, row, cols, live & ok[:, None, None], K, MODE)
        if MODE != 3:
            w = tl.load(nw_ptr + cols, mask=ok[:, None, None], other=0.0).to(tl.float32)
            h = (h * inv * w).to(x_ptr.dtype.element_ty).to(tl.float32)
        quantize_store(h, qa_ptr, da_ptr, row, blocks, ok, j3, e3, K, ASM)
