"""Prefetch the next projection's weights into L2 from the kernel that runs before it.

A batch-1 decode step is a chain of small launches, and HBM sits idle through the ones that read little (the
norms, the attention, the quantizers) while each GEMV then starts its weight stream cold: the 1.5B step
moves ~1 GB in 1.1 ms, ~0.9 TB/s of the ~3.5 the H200 can stream (tools/results/h200_engine_profile_69717b2.json).
The kernel before a projection therefore also issues `cp.async.bulk.prefetch.L2` (sm_90) over that
projection's largest weight planes: fire-and-forget requests that fill L2 (50 MB, a 1.5B layer's GEMVs are
27 MB) while the chain goes on, so the GEMV's loads hit L2 or in-flight lines.

`prefetch_l2` splits a buffer's bytes over the launch's programs, each program over the LANES threads of its
first warp, each thread one bulk request (a hint: no completion to wait for, no effect on results). `prefetch_args` picks the
planes of a weight worth prefetching. EMBER_L2_PREFETCH=0 (read at trace time) turns it off. ASM=False
(Triton's CPU interpreter) skips the instruction: a prefetch changes no value.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

PREFETCH_ENV = "EMBER_L2_PREFETCH"
LANES = tl.constexpr(32)  # bulk requests per program
MAX_PLANES = 2  # planes one launch prefetches (Q4_K's codes and scales; Q6_K's low and high bits)


@triton.jit
def prefetch_l2(ptr, NBYTES: tl.constexpr, part, parts, ASM: tl.constexpr):
    """Program `part` of `parts` requests its share of the first NBYTES (rounded down to 16) bytes at ptr
    (16-byte aligned) into L2, one bulk prefetch per lane."""
    if ASM and NBYTES >= 16:
        total = NBYTES // 16 * 16
        share = tl.cdiv(tl.cdiv(total, parts), 16) * 16
        lane_bytes = tl.cdiv(tl.cdiv(share, LANES), 16) * 16
        start = part * share + tl.arange(0, LANES) * lane_bytes  # byte offsets [LANES]
        stop = tl.minimum((part + 1) * share, total)
        size = tl.maximum(tl.minimum(start + lane_bytes, stop) - start, 0).to(tl.int32)
        addr = ptr.to(tl.pointer_type(tl.int8), bitcast=True) + start
        tl.inline_asm_elementwise(
            # warp 0 only: a [LANES] tensor is repeated in every warp of the program (one element a thread)
            "{ .reg .pred p, q; .reg .u32 t; mov.u32 t, %tid.x; setp.gt.s32 p, $2, 0; setp.lt.u32 q, t, 32; "
            "and.pred p, p, q; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


def enabled() -> bool:
    return os.environ.get(PREFETCH_ENV, "1") != "0"


def prefetch_args(weight, rows: int, fallback) -> tuple[tuple, dict]:
    """(MAX_PLANES arrays, {PF0_BYTES, PF1_BYTES}) for a launch that prefetches what a `rows`-row call of
    `weight` reads: its largest quantized planes (of every part of a WeightGroup); nothing for a dense form
    or with prefetch off, `fallback` then standing in for the pointers (never read)."""
    from .linear_quant import form_for_rows
    from .quant.layout import QuantizedWeight, WeightGroup

    planes = []
    if enabled():
        form = form_for_rows(rows, weight)
        for part in form.parts if isinstance(form, WeightGroup) else (form,):
            if isinstance(part, QuantizedWeight):
                planes.extend(part.planes.values())
    planes = sorted(planes, key=lambda a: a.size * a.dtype.itemsize, reverse=True)[:MAX_PLANES]
    arrays = tuple(planes) + (fallback,) * (MAX_PLANES - len(planes))
    sizes = [a.size * a.dtype.itemsize for a in planes] + [0] * (MAX_PLANES - len(planes))
    return arrays, {f"PF{i}_BYTES": int(n) for i, n in enumerate(sizes)}
