"""A residual add + RMSNorm and the one projection reading the normed row, as one op (the fuse_norm_into_gemv
pass): where the projection's GEMV can make the norm in its prologue (FP8 weights, one decode row:
quant/fp8_norm_gemv.py) one launch does both and the norm kernel is gone; everywhere else the op runs the two
ops it replaced, unchanged (norm_quant_gpu.add_rms_norm_to_proj, then linear_quant's projection).

EMBER_FUSED_NORM_GEMV=0 (read at trace time) keeps the two ops on a GPU too, for side-by-side measurements.
"""

from __future__ import annotations

import os

from . import norm_gpu
from .linear_quant import form_for_rows, gated_mlp, linear, linear_split
from .norm_quant_gpu import add_rms_norm_to_proj
from .quant.fp8 import Fp8Weight, use_fp8_gemv
from .split_k import SplitKPartials

FUSED_ENV = "EMBER_FUSED_NORM_GEMV"


def _fused_weight(x, y, weight, form: str, sizes: tuple[int, ...] = ()):
    """The projection's Fp8Weight where the fused kernel takes x, y and it, else None (decided at trace time)."""
    from .quant import fp8_norm_gemv  # Triton kernels: imported on use

    if os.environ.get(FUSED_ENV, "1") == "0" or not norm_gpu.use_kernel(x):
        return None
    weight = form_for_rows(int(x.shape[0]), weight)
    if not isinstance(weight, Fp8Weight) or not use_fp8_gemv(x, weight):
        return None
    # y: the projection output to add (an array like x, not split-K partials), or None (no add: layer 0)
    if y is not None and (isinstance(y, SplitKPartials) or y.shape != x.shape or y.dtype != x.dtype):
        return None
    return weight if fp8_norm_gemv.fits(x, weight, form, sizes) else None


def add_rms_norm_linear_split(x, y, weight, proj, bias=None, *, sizes, eps):
    # x, y [N, d] (y None: no add), weight [d], proj [sum(sizes), d] -> (x + y, *projections of its norm)
    sizes = tuple(sizes)
    fused = _fused_weight(x, y, proj, "parts", sizes) if bias is None else None
    if fused is not None:
        from .quant.fp8_norm_gemv import fp8_norm_gemv

        s, outs = fp8_norm_gemv(x, y, weight, fused, eps=eps, form="parts", sizes=sizes)
        return (s, *outs)
    s, h = add_rms_norm_to_proj(x, y, weight, proj, eps=eps)
    return (s, *linear_split(h, proj, bias, sizes=sizes))


def add_rms_norm_gated_mlp(x, y, weight, gate_up, down, *, act, partials=False, eps):
    # x, y [N, d], weight [d], gate_up [2 ffn, d], down [d', ffn] -> (x + y, act(gate) * up @ down.T)
    fused = _fused_weight(x, y, gate_up, "gate_up") if act == "silu" else None
    if fused is not None:
        from .quant.fp8_norm_gemv import fp8_norm_gemv

        s, (gated,) = fp8_norm_gemv(x, y, weight, fused, eps=eps, form="gate_up")
        return s, linear(gated, down)
    s, h = add_rms_norm_to_proj(x, y, weight, gate_up, eps=eps)
    return s, gated_mlp(h, gate_up, down, act=act, partials=partials)
