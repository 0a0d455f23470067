"""RMSNorm (alone, or after the residual add) that also writes its output as the int8 activations of the
decode GEMV that alone reads it: that projection's activation quantizer costs no launch of its own.

The compiler's fuse_norm_into_projection pass turns a norm whose output feeds exactly one projection into
`rms_norm_to_proj` / `add_rms_norm_to_proj`, which receive that projection's weight (`reader`) only to see,
at trace time, whether its GEMV takes int8 activations at this row count and in which packing
(linear_quant.dp4a_input_order). If it does, one Triton program per row normalizes the row as
norm/kernel.py's kernels do (same fp32 statistics, same roundings: the bf16 output is bit-equal), stores it,
then rearranges the same values in registers into the packed layout (act_quant.PACKINGS) and quantizes them
as gguf_gemv/act_quant_kernel.py does. Every load (x, the residual operand, w) is issued before the first reduction,
so a row costs one memory round trip. The residual operand may be a down projection's split-K partials
(split_k.py, the carry_split_k_partials pass), summed here instead of by an XLA launch of its own. The result
is a linear_quant.QuantizedInput (the bf16 rows + qa + da); otherwise the plain norm (norm/kernel.py).

On by default; the kernel policy's norms.fused_quant off (read at trace time) turns it off. Checked in Triton's interpreter
(tests/kernels/norm/test_norm_interpret.py: rows and int8 words bit-equal to the plain norm + quantizer) and on the H200
(tests/kernels/norm/test_norm_kernels_gpu.py: bit-equal to the Triton quantizer it replaces). Measured there,
plan alone at batch 1 (docs/results/h200_fused_norm_quant_cfef150.json): 1.5B Q4_K_M 439 -> 382 kernels,
1.163 -> 1.147 ms per step; 8B Q4_K_M 517 -> 452 kernels, 2.398 -> 2.374 ms.
"""

from __future__ import annotations

import math

import jax
import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.act_quant import act_terms, packed_shapes
from ember.compiler.kernels.gguf_gemv.act_quant_kernel import packed_order, quantize_store
from ember.compiler.kernels.norm import kernel as norm_gpu
from ember.compiler.kernels.split_k import SplitKPartials, materialized
from ember.compiler.targets.policy import kernel_policy

# Split-K partials per row the kernel sums itself; above, XLA's sum runs first. One program reads them all:
# the 1.5B's 8 x 1536 fp32 (48 KB) cost 3.31 us against 2.58 + 1.14 for the plain norm and the sum, the
# 8B's 8 x 4096 (128 KB) 5.34 us against 2.96 + 1.25 (docs/results/h200_plan_alone_partials_f842b9c_*.json)
PARTIALS_MAX_BYTES = 48 * 1024


@triton.jit
def _packed(h, NB: tl.constexpr, Q6: tl.constexpr):
    """h [NB * 32] fp32, a row in element order -> [NB, 4, 8], the same values in the packed layout the GEMV's
    activations take (packed_order's e3 within each block of 32), rearranged in registers."""
    if Q6:  # element 16 a + 4 j + b of a block goes to (j, 4 a + b)
        return tl.reshape(tl.permute(tl.reshape(h, [NB, 2, 4, 4]), [0, 2, 1, 3]), [NB, 4, 8])
    return tl.reshape(h, [NB, 4, 8])  # element 8 j + w goes to (j, w)


@triton.jit
def _norm_quantize(
    x_ptr,
    y_ptr,
    w_ptr,
    sum_ptr,
    out_ptr,
    qa_ptr,
    da_ptr,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr,
    EPS: tl.constexpr,
    ADD: tl.constexpr,
    SPLITS: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    Q6: tl.constexpr,
    ASM: tl.constexpr,
    TERMS: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    # every load is issued before the first reduction: one memory round trip per row
    s = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if ADD:
        y = tl.load(y_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        if SPLITS > 0:  # y: a projection's fp32 split-K partials [SPLITS, ROWS_PAD, N], its output once summed
            for k in tl.static_range(1, SPLITS):
                y += tl.load(y_ptr + (k * ROWS_PAD + row) * N + cols, mask=ok, other=0.0)
            y = y.to(sum_ptr.dtype.element_ty).to(tl.float32)  # rounded as that output is
        s = (s + y).to(sum_ptr.dtype.element_ty)  # the residual stream, rounded as the reference's add
        tl.store(sum_ptr + row * N + cols, s, mask=ok)
        s = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / N + EPS)
    h = (s * inv * w).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * N + cols, h, mask=ok)
    blocks = tl.arange(0, NB)
    j3, e3 = packed_order(Q6)
    quantize_store(
        _packed(h.to(tl.float32), NB, Q6), qa_ptr, da_ptr, row, blocks, blocks < N // 32, j3, e3, N, ASM, TERMS
    )


@triton.jit
def rms_norm_quant_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    qa_ptr,
    da_ptr,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr,
    EPS: tl.constexpr,
    Q6: tl.constexpr,
    ASM: tl.constexpr,
    TERMS: tl.constexpr = 1,
):
    """x [rows, N] -> out [rows, N] = rms_norm(x) and its int8 activations qa [rows, TERMS N/4], da
    [rows, N/32, 4 TERMS]."""
    _norm_quantize(
        x_ptr, x_ptr, w_ptr, out_ptr, out_ptr, qa_ptr, da_ptr, N, BLOCK, NB, EPS, False, 0, 0, Q6, ASM, TERMS
    )


@triton.jit
def add_rms_norm_quant_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    sum_ptr,
    out_ptr,
    qa_ptr,
    da_ptr,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr,
    EPS: tl.constexpr,
    Q6: tl.constexpr,
    ASM: tl.constexpr,
    SPLITS: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    TERMS: tl.constexpr = 1,
):
    """x, y [rows, N] -> sum = x + y, out = rms_norm(sum), and out's int8 activations qa, da. SPLITS > 0: y is
    fp32 split-K partials [SPLITS, ROWS_PAD, N] (split_k.SplitKPartials), summed here."""
    _norm_quantize(
        x_ptr, y_ptr, w_ptr, sum_ptr, out_ptr, qa_ptr, da_ptr, N, BLOCK, NB, EPS, True, SPLITS, ROWS_PAD, Q6, ASM, TERMS
    )


def launch_plan(rows: int, n: int, order: str) -> dict:
    """norm_gpu.launch_plan's grid and tile, plus the packed layout's blocks and order, at the policy's
    norms.quant_warps warps per program (read at trace time)."""
    if n % 32:
        raise ValueError(f"rms_norm + quantize: rows of a multiple of 32 elements, got {n}")
    plan = norm_gpu.launch_plan(rows, n)
    plan["num_warps"] = kernel_policy().norms.quant_warps
    plan["meta"].update(NB=1 << (n // 32 - 1).bit_length(), Q6=order == "q6_k", TERMS=act_terms())
    return plan


def norm_quantize_triton(x, y, weight, *, eps, order: str):
    """The launch: x (and y, the residual add's other input, or None) [..., n] -> (the sum when y is given,
    the normed rows, qa [rows, terms n/4], da [rows, n/32, 4 terms]), whatever the backend being traced for. y may be a
    split_k.SplitKPartials of x's [rows, n] (x 2-D), which the kernel sums as it reads it."""
    from ember.compiler.kernels.triton.launch import triton_call

    rows, n = math.prod(x.shape[:-1]), x.shape[-1]
    plan = launch_plan(rows, n, order)
    rows_out = jax.ShapeDtypeStruct((rows, n), x.dtype)
    activations = packed_shapes(rows, n, plan["meta"]["TERMS"])
    operands = [x.reshape(rows, n)]
    if isinstance(y, SplitKPartials):  # read in place: [splits, rows_pad, n]
        operands.append(y.parts)
        plan["meta"].update(SPLITS=int(y.parts.shape[0]), ROWS_PAD=int(y.parts.shape[1]))
    elif y is not None:
        operands.append(y.reshape(rows, n))
        plan["meta"].update(SPLITS=0, ROWS_PAD=0)
    outs = triton_call(
        *operands,
        weight,
        kernel=rms_norm_quant_kernel if y is None else add_rms_norm_quant_kernel,
        out_shape=(rows_out,) * len(operands) + activations,
        grid=plan["grid"],
        num_warps=plan["num_warps"],
        num_stages=1,
        EPS=float(eps),
        ASM=True,
        **plan["meta"],
    )
    return (*(o.reshape(x.shape) for o in outs[: len(operands)]), *outs[len(operands) :])


def _order(x, reader) -> str | None:
    from ember.compiler.kernels.gguf_gemv.linear import dp4a_input_order

    if x.ndim != 2 or x.shape[-1] % 32 or not norm_gpu.use_kernel(x) or not kernel_policy().norms.fused_quant:
        return None
    return dp4a_input_order(reader, x.shape[0])


def rms_norm_to_proj(x, weight, reader, *, eps):
    # x [N, n], weight [n]; reader: the weight of the one projection reading the output -> that projection's
    # input: a linear_quant.QuantizedInput where its GEMV takes int8 activations, else norm_gpu.rms_norm's
    from ember.compiler.kernels.gguf_gemv.linear import QuantizedInput

    order = _order(x, reader)
    if order is None:
        return norm_gpu.rms_norm(x, weight, eps=eps)
    h, qa, da = norm_quantize_triton(x, None, weight, eps=eps, order=order)
    return QuantizedInput(h, qa, da, order)


def add_rms_norm_to_proj(x, y, weight, reader, *, eps):
    # -> (x + y, rms_norm_to_proj(x + y)): the sum is the new residual stream (y None: x and its norm; y a
    # split_k.SplitKPartials: summed by the kernel, or first where the kernel does not run)
    from ember.compiler.kernels.gguf_gemv.linear import QuantizedInput

    if y is None:
        return x, rms_norm_to_proj(x, weight, reader, eps=eps)
    if isinstance(y, SplitKPartials) and y.bytes_per_row > PARTIALS_MAX_BYTES:
        y = materialized(y)
    order = _order(x, reader)
    if order is None or y.shape != x.shape or y.dtype != x.dtype:
        return norm_gpu.add_rms_norm(x, y, weight, eps=eps)
    s, h, qa, da = norm_quantize_triton(x, y, weight, eps=eps, order=order)
    return s, QuantizedInput(h, qa, da, order)
