"""Warm the L2 cache with the first bytes of the next projection's weight, from the small kernel before it.

Why: at one decode row the step is a chain of weight-streaming GEMVs with short kernels between them (the
norms, the attention). While those run, and while each GEMV ramps up, HBM is idle. A Hopper bulk prefetch
(`cp.async.bulk.prefetch.L2.global`, one instruction per thread, fire and forget) issued by the kernel that
precedes a projection starts that projection's weight stream early: its first programs then read from L2.
The projection's weight reaches the producer as its `reader` (the fuse_norm_into_projection pass), so no
new graph edge is needed; the GEMV itself is unchanged.

How much: EMBER_L2_PREFETCH_BYTES (read at trace time) bytes from the start of the reader's largest array
(a dense matrix, FP8 values, a GGUF format's biggest plane), at most that array's size, in `threads` equal
chunks (one per thread of the prefetching program, program 0 only), only when the step has at most
EMBER_L2_PREFETCH_ROWS rows (1 by default: larger batches are not bound by one weight stream). 0 turns it off.
"""

from __future__ import annotations

import os

import jax
import triton
import triton.language as tl

BYTES_ENV = "EMBER_L2_PREFETCH_BYTES"
ROWS_ENV = "EMBER_L2_PREFETCH_ROWS"
DEFAULT_BYTES = 0
DEFAULT_ROWS = 1
CHUNK_ALIGN = 16  # the bulk prefetch's address and size granularity


@triton.jit
def prefetch_l2(base_ptr, BYTES: tl.constexpr, CHUNKS: tl.constexpr):
    """Prefetch bytes [0, BYTES) of base_ptr's buffer into L2 as CHUNKS bulk prefetches (BYTES // CHUNKS each,
    a multiple of 16); call it from one program, with CHUNKS = its thread count so each thread issues one."""
    if BYTES > 0:
        chunk: tl.constexpr = BYTES // CHUNKS
        ptrs = base_ptr.to(tl.pointer_type(tl.int8)) + tl.arange(0, CHUNKS).to(tl.int64) * chunk
        sizes = tl.full([CHUNKS], chunk, tl.int32)
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                  [ptrs, sizes], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_plan(reader, rows: int, threads: int) -> tuple[jax.Array | None, int]:
    """(the array to prefetch from, bytes) for a producer of `rows` rows whose projection reads `reader`
    (None, 0: no prefetch). bytes is a multiple of threads * 16, at most the array's size."""
    wanted = int(os.environ.get(BYTES_ENV, DEFAULT_BYTES))
    if reader is None or wanted <= 0 or rows > int(os.environ.get(ROWS_ENV, DEFAULT_ROWS)):
        return None, 0
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(reader) if hasattr(leaf, "nbytes")]
    if not leaves:
        return None, 0
    array = max(leaves, key=lambda leaf: leaf.nbytes)
    quantum = threads * CHUNK_ALIGN
    size = min(wanted, int(array.nbytes)) // quantum * quantum
    return (array, size) if size else (None, 0)
