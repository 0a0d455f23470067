"""Gated DeltaNet's output norm, RMSNorm(x) * weight * silu(gate) per head, as one Triton kernel: the GPU twin
of reference.gated_rms_norm (XLA runs it as a reduce, then the scale, gate and convert).

Grid (rows * heads,): program i owns head vector i of n elements (one masked tile of BLOCK = the next power
of two >= n). Rounded where the reference rounds: the normed value once to x's dtype, its product with the
weight once more when that product is in x's dtype (a bf16 weight), the gated result once at the end.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gated_rms_norm_kernel(
    x_ptr, gate_ptr, w_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr, EPS: tl.constexpr, ROUND_WN: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(gate_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + EPS)
    normed = (x * inv).to(dtype).to(tl.float32)
    wn = w * normed
    if ROUND_WN:
        wn = wn.to(dtype).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (wn * (z * tl.sigmoid(z))).to(dtype), mask=ok)


def launch_plan(rows: int, n: int) -> dict:
    """Grid and constants for `rows` head vectors of n elements (EPS and ROUND_WN added by the caller)."""
    block = triton.next_power_of_2(n)
    return {"grid": (rows,), "num_warps": 4 if block <= 1024 else 8, "meta": {"N": n, "BLOCK": block}}
