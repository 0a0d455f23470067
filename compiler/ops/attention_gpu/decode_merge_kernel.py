"""Triton kernel: the RoPE-fused split partials with the combine folded in ("last arrival merges").

paged_decode_rope_merge_kernel is paged_decode_rope_partials_kernel (decode_kernel.py) plus the combine
(decode_combine_kernel.py) in the same launch: after program (b, h, split) has stored its partial rows it
counts its arrival on an int32 counter of (b, h); the program that arrives last (its ticket is SPLITS - 1)
merges the G query heads of KV head h over the row's used splits, writes them (and, with QUANT, the int8
activations of the projection reading them, as paged_decode_combine_quant_kernel does), and sets the counter
back to 0 for the next launch. The step loses the combine's launch; the price is the merge's latency at the
end of the last program, which grows with the splits a row uses (a short row fills one or two).

Where the counters live. They need memory that persists between launches, starts at 0 and that XLA lets the
kernel write: the K pool, which this kernel already takes as an aliased in/out buffer. Counter (b, h) is the
int32 at element offset HKV * DH of the pool (slot 1 of reserved block 0) plus b * HKV + h. The runtime
never writes or reads there (runtime/kv.py: padding and discarded run-ahead writes go to slot 0 of block 0;
tables padded with block 0 are only walked by discarded rows), the pools start zeroed, and every launch
leaves the counters at 0. decode.merge_capacity says how many rows the slot room holds.

Memory ordering (the pattern of CUTLASS's split-K semaphore): all threads' partial stores, a CTA barrier,
then one acq_rel atomic at GPU scope, so a program that sees SPLITS - 1 arrivals before its own also sees
every other program's partials; it reads them past L1 (.cg). The merge reads the used splits in a fixed order,
so the output does not depend on which program came last (bit-identical run to run).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..quant.triton_act_quant import packed_order, quantize_store
from .decode_combine_kernel import packed_elements
from .decode_kernel import rope_partials


@triton.jit
def merge_group(acc_ptr, m_ptr, l_ptr, b, h, used, d, HKV: tl.constexpr, G: tl.constexpr, G_MERGE: tl.constexpr,
                DH: tl.constexpr, SPLITS: tl.constexpr, CHUNK: tl.constexpr):
    """Query heads h G .. h G + G - 1 of row b merged over splits 0 .. used - 1 (the rest are empty), at the
    heads' elements `d` [DH] (any order) -> [G_MERGE, DH] fp32 (rows >= G: 0). decode.combine_partials' formula;
    CHUNK splits per tile, two passes (the maxima, then the weighted sums)."""
    g = tl.arange(0, G_MERGE)
    c = tl.arange(0, CHUNK)
    base = (b * HKV + h) * SPLITS * G  # partial row of (split s, head g): base + s * G + g
    g_ok = (g < G)[None, :]
    m_max = tl.full([G_MERGE], float("-inf"), tl.float32)
    for first in range(0, used, CHUNK):
        rows = base + (first + c)[:, None] * G + g[None, :]  # [CHUNK, G_MERGE]
        ok = ((first + c) < used)[:, None] & g_ok
        m_max = tl.maximum(m_max, tl.max(tl.load(m_ptr + rows, mask=ok, other=float("-inf"), cache_modifier=".cg"),
                                          axis=0))
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
    num = tl.zeros([G_MERGE, DH], tl.float32)
    den = tl.zeros([G_MERGE], tl.float32)
    for first in range(0, used, CHUNK):
        rows = base + (first + c)[:, None] * G + g[None, :]
        ok = ((first + c) < used)[:, None] & g_ok
        weight = tl.exp2(tl.load(m_ptr + rows, mask=ok, other=float("-inf"), cache_modifier=".cg") - m_ref[None, :])
        den += tl.sum(weight * tl.load(l_ptr + rows, mask=ok, other=0.0, cache_modifier=".cg"), axis=0)
        part = tl.load(acc_ptr + rows[:, :, None] * DH + d[None, None, :], mask=ok[:, :, None], other=0.0,
                       cache_modifier=".cg")  # [CHUNK, G_MERGE, DH]
        num += tl.sum(weight[:, :, None] * part, axis=0)
    return num / tl.where(den > 0.0, den, 1.0)[:, None]


@triton.jit
def paged_decode_rope_merge_kernel(q_ptr, k_new_ptr, v_new_ptr, inv_freq_ptr, slots_ptr, k_pool_in, v_pool_in,
                                   table_ptr, ctx_ptr, pos_ptr, window_ptr, acc_ptr, m_ptr, l_ptr, k_ptr, v_ptr,
                                   out_ptr, qa_ptr, da_ptr, QK_SCALE: tl.constexpr, HQ: tl.constexpr,
                                   HKV: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, DH: tl.constexpr,
                                   DH_PAD: tl.constexpr, BS: tl.constexpr, W: tl.constexpr, BLOCK_N: tl.constexpr,
                                   SPLITS: tl.constexpr, DOT_FP32: tl.constexpr, INTERLEAVED: tl.constexpr,
                                   G_MERGE: tl.constexpr, CHUNK: tl.constexpr, QUANT: tl.constexpr,
                                   Q6: tl.constexpr, ASM: tl.constexpr):
    # paged_decode_rope_partials_kernel's inputs and outputs (acc, m, l scratch; the pools aliased, written in
    # place), then out [B, HQ, DH] in q's dtype and, with QUANT, qa int32 [B, HQ * DH / 4] and da fp32
    # [B, HQ * DH / 32, 4] (triton_act_quant's packing for Q4_K, or Q6_K when Q6; without QUANT both are
    # one-element placeholders). DH is a power of two >= 32.
    visible = rope_partials(q_ptr, k_new_ptr, v_new_ptr, inv_freq_ptr, slots_ptr, table_ptr, ctx_ptr, pos_ptr,
                            window_ptr, acc_ptr, m_ptr, l_ptr, k_ptr, v_ptr, QK_SCALE, HQ, HKV, G, G_PAD, DH,
                            DH_PAD, BS, W, BLOCK_N, SPLITS, DOT_FP32, INTERLEAVED, True)
    b = tl.program_id(0)
    h = tl.program_id(1)
    counter = (k_ptr + HKV * DH).to(tl.pointer_type(tl.int32)) + b * HKV + h  # slot 1 of block 0
    tl.debug_barrier()  # every thread's partial stores come before the arrival is counted
    ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLITS - 1:
        start, end = visible
        n_iters = tl.cdiv(end - start, BLOCK_N)
        per_split = tl.maximum(tl.cdiv(n_iters, SPLITS), 1)
        used = tl.cdiv(n_iters, per_split)  # splits holding tokens: the first `used`
        d = packed_elements(DH, Q6)  # Q6 only with QUANT: the merged values are then the quantizer's tile as is
        out = merge_group(acc_ptr, m_ptr, l_ptr, b, h, used, d, HKV, G, G_MERGE, DH, SPLITS, CHUNK)
        out = out.to(out_ptr.dtype.element_ty)
        g = tl.arange(0, G_MERGE)
        tl.store(out_ptr + (b * HQ + h * G + g)[:, None] * DH + d[None, :], out, mask=(g < G)[:, None])
        if QUANT:
            j3, e3 = packed_order(Q6)
            blocks = h * G * (DH // 32) + tl.arange(0, G_MERGE * (DH // 32))
            quantize_store(tl.reshape(out.to(tl.float32), [G_MERGE * (DH // 32), 4, 8]), qa_ptr, da_ptr, b, blocks,
                           blocks < (h + 1) * G * (DH // 32), j3, e3, HQ * DH, ASM)
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next launch
