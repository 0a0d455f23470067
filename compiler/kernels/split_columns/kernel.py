"""split_columns (gguf_gemv/matmul.py) for three projections in one Triton launch: a packed dense q/k/v
projection's output y [rows, S0 + S1 + S2] -> q [rows, S0], k [rows, S1], v [rows, S2].

Why: where the reader is a custom call (the RoPE-fused decode attention takes q, k and v as three arrays),
XLA copies each slice of the GEMM's output with a kernel of its own. In the 8B bf16 step those three took
119.7 us per step; this one launch takes 36.6 us, plus 43.0 us for XLA's split-K sum, which the slices had
folded in (docs/results/h200_plan_alone_split_skip_2212847.json). Quantized and FP8 projections write their
parts themselves (the parts GEMVs); this is the dense weights' one launch.

Grid (rows, cdiv(S0 + S1 + S2, BLOCK)): program (r, c) loads its column tile of row r once and stores each
element into the output its column falls in (three masked stores, at most two of them non-empty).
The kernel policy's split.triton off (read at trace time) keeps XLA's slices on a GPU too: the side-by-side
measurement.
"""

from __future__ import annotations

import jax
import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.matmul import split_columns
from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy

BLOCK = 1024  # columns per program: 2 KB of bf16, a handful of programs per row
MAX_ROWS = 256  # decode-sized steps (A/B at 1 row; the 8- and 32-stream benches ran with it); prefill keeps slices


@triton.jit
def split_columns_kernel(
    y_ptr, a_ptr, b_ptr, c_ptr, S0: tl.constexpr, S1: tl.constexpr, S2: tl.constexpr, BLOCK: tl.constexpr
):
    # y [rows, S0 + S1 + S2] -> a [rows, S0], b [rows, S1], c [rows, S2]
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    total: tl.constexpr = S0 + S1 + S2
    x = tl.load(y_ptr + row * total + cols, mask=cols < total)
    tl.store(a_ptr + row * S0 + cols, x, mask=cols < S0)
    tl.store(b_ptr + row * S1 + (cols - S0), x, mask=(cols >= S0) & (cols < S0 + S1))
    tl.store(c_ptr + row * S2 + (cols - S0 - S1), x, mask=(cols >= S0 + S1) & (cols < total))


def split_three(y: jax.Array, sizes) -> tuple[jax.Array, ...]:
    """y [rows, sum(sizes)] -> one array per size (split_columns), in one launch where it applies: a GPU
    trace, three sizes, a 2-D y of at most MAX_ROWS rows."""
    if (
        len(sizes) != 3
        or y.ndim != 2
        or y.shape[0] > MAX_ROWS
        or not triton_available()
        or not kernel_policy().split.triton
    ):
        return split_columns(y, sizes)
    from ember.compiler.kernels.triton.launch import triton_call

    rows = y.shape[0]
    s0, s1, s2 = (int(s) for s in sizes)
    return triton_call(
        y,
        kernel=split_columns_kernel,
        out_shape=tuple(jax.ShapeDtypeStruct((rows, s), y.dtype) for s in (s0, s1, s2)),
        grid=(rows, -(-(s0 + s1 + s2) // BLOCK)),
        num_warps=4,
        num_stages=1,
        S0=s0,
        S1=s1,
        S2=s2,
        BLOCK=BLOCK,
    )
