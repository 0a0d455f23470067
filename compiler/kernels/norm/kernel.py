"""RMSNorm, and the residual add + RMSNorm, as one Triton kernel each: GPU twins of norm.py's references with
the same signatures, for a target's `kernels` ("rms_norm", "add_rms_norm").

Why: XLA runs add + RMSNorm as three kernels — the add, the sum-of-squares reduce, the scale and convert
(docs/results/h200_step_profile_c32c507_llama3-8b_batch1.json: ~4.3 µs per norm at batch 1, 64 norms per
8B step) — where one program per row can do all of it, reading each input once.

Grid (rows,): program r owns row r of x (and y), N elements in one masked tile of BLOCK = the next power of
two >= N. The add is computed as XLA computes a bf16 add (fp32 sum rounded once to the activation dtype) and
stored as the new residual; the statistics are fp32; out = (s * rsqrt(mean(s^2) + eps)) * w, rounded once.
The h200 target names them. Traced for a non-GPU backend (or without Triton) the functions are the
references, and the kernel policy's norms.triton off (read at trace time) makes them the references on a GPU
too: the side-by-side measurement of the two (tools/dev/profile_step.py --plan-only under each setting).
"""

from __future__ import annotations

import math

import jax
import triton
import triton.language as tl

from ember.compiler.kernels.norm import reference as norm_ref
from ember.compiler.kernels.split_k import materialized
from ember.compiler.kernels.triton.available import triton_available
from ember.compiler.targets.policy import kernel_policy

MAX_N = 65536  # one row per program, held in registers: the widest hidden size this tiling takes


@triton.jit
def _normalize_store(s, w, out_ptr, row, cols, ok, N: tl.constexpr, EPS: tl.constexpr):
    """s, w [BLOCK] fp32 (0 past N) -> out[row] = s * rsqrt(mean(s^2) + EPS) * w in out's dtype."""
    inv = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / N + EPS)
    tl.store(out_ptr + row * N + cols, (s * inv * w).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr, EPS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    s = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    _normalize_store(s, w, out_ptr, row, cols, ok, N, EPS)


@triton.jit
def add_rms_norm_kernel(x_ptr, y_ptr, w_ptr, sum_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr, EPS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)  # every load before the reduction
    s = (x + y).to(sum_ptr.dtype.element_ty)  # the residual stream, as the reference rounds it
    tl.store(sum_ptr + row * N + cols, s, mask=ok)
    _normalize_store(s.to(tl.float32), w, out_ptr, row, cols, ok, N, EPS)


def launch_plan(rows: int, n: int) -> dict:
    """Grid and compile-time constants for `rows` rows of `n` elements (eps is added by the caller)."""
    if not 1 <= n <= MAX_N:
        raise ValueError(f"rms_norm kernel: rows of 1..{MAX_N} elements, got {n}")
    block = 1 << (n - 1).bit_length()
    warps = kernel_policy().norms.warps  # read at trace time
    return {"grid": (rows,), "num_warps": warps, "meta": {"N": n, "BLOCK": block}}


def use_kernel(x) -> bool:
    """Whether the Triton kernels run for x (a GPU with Triton, the policy's norms.triton, rows to norm)."""
    return kernel_policy().norms.triton and triton_available() and math.prod(x.shape[:-1]) > 0


def rms_norm(x, weight, *, eps, reference=norm_ref.rms_norm):
    # x [..., n], weight [n] -> [..., n] in x's dtype; `reference` where the kernel does not run
    if not use_kernel(x):
        return reference(x, weight, eps=eps)
    return rms_norm_triton(x, weight, eps=eps)


def add_rms_norm(x, y, weight, *, eps, reference=norm_ref.add_rms_norm):
    # -> (x + y, rms_norm(x + y)), both [..., n] in x's dtype (y None: (x, rms_norm(x)))
    y = None if y is None else materialized(y)
    if not use_kernel(x) or (y is not None and (y.shape != x.shape or y.dtype != x.dtype)):
        return reference(x, y, weight, eps=eps)
    return (x, rms_norm_triton(x, weight, eps=eps)) if y is None else add_rms_norm_triton(x, y, weight, eps=eps)


def rms_norm_invariant(x, weight, *, eps):
    """The deterministic plans' norm: the kernel (one program per row, its sums in an order fixed by the row's
    length alone, so a row's bits do not depend on the rows beside it: tests/test_deterministic_ops_gpu.py), or
    the fixed-order reference where the kernel does not run."""
    return rms_norm(x, weight, eps=eps, reference=norm_ref.rms_norm_invariant)


def add_rms_norm_invariant(x, y, weight, *, eps):
    return add_rms_norm(x, y, weight, eps=eps, reference=norm_ref.add_rms_norm_invariant)


def _launch_rows(kernel, rows_in: tuple, weight, outputs: int, eps: float) -> tuple:
    """Launch `kernel` over the rows of the [..., n] inputs `rows_in` (then weight): `outputs` arrays of the
    first input's shape and dtype."""
    from ember.compiler.kernels.triton.launch import triton_call

    x = rows_in[0]
    rows, n = math.prod(x.shape[:-1]), x.shape[-1]
    plan = launch_plan(rows, n)
    out_shape = jax.ShapeDtypeStruct((rows, n), x.dtype)
    outs = triton_call(
        *(a.reshape(rows, n) for a in rows_in),
        weight,
        kernel=kernel,
        out_shape=(out_shape,) * outputs,
        grid=plan["grid"],
        num_warps=plan["num_warps"],
        num_stages=1,
        EPS=float(eps),
        **plan["meta"],
    )
    return tuple(o.reshape(x.shape) for o in outs)


def rms_norm_triton(x, weight, *, eps):
    """The kernel's launch, whatever the backend being traced for (lowered for cuda anywhere)."""
    (out,) = _launch_rows(rms_norm_kernel, (x,), weight, 1, eps)
    return out


def add_rms_norm_triton(x, y, weight, *, eps):
    """The kernel's launch (y of x's shape and dtype), whatever the backend being traced for."""
    return _launch_rows(add_rms_norm_kernel, (x, y), weight, 2, eps)
