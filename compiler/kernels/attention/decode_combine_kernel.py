"""Triton kernels: the split-K decode attention's combine (flash-decoding's second pass).

Split s of a row / KV head wrote acc_s [G, dh] unnormalized, m_s, l_s [G] (decode_kernel.py); query head
`head` of row b is merged as sum_s exp2(m_s - M) acc_s / sum_s exp2(m_s - M) l_s with M = max_s m_s
(decode.combine_partials is the same merge in jnp). The combine kernels merge one head per program (row,
query head).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ember.compiler.kernels.gguf_gemv.act_quant_kernel import packed_order, quantize_store


@triton.jit
def _combine_head(
    acc_ptr,
    m_ptr,
    l_ptr,
    b,
    head,
    d,
    HKV: tl.constexpr,
    G: tl.constexpr,
    DH: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Query head `head` of row b merged over its splits, at the head's elements `d` (any order; >= DH: 0):
    decode.combine_partials' formula, with M = max_s m_s, sum_s exp2(m_s - M) acc_s / sum_s exp2(m_s - M) l_s
    (0 where nothing was visible). Only splits up to the last non-empty one are read (a short row in a wide
    table fills a few of its SPLITS), CHUNK of them per tile, so a long row's 64 splits cost a few dependent
    loads, not 64."""
    base = ((b * HKV + head // G) * SPLITS) * G + head % G  # partial row of split 0; split s: + s * G
    s = tl.arange(0, SPLITS_PAD)
    c = tl.arange(0, CHUNK)
    # the first CHUNK splits are loaded with the maxima, not after them: a short row (one chunk) costs one
    # round trip; splits past the used ones hold m = -inf, l = 0, acc = 0 and add exactly 0
    first_ok = c < SPLITS
    m_first = tl.load(m_ptr + base + c * G, mask=first_ok, other=float("-inf"))
    l_first = tl.load(l_ptr + base + c * G, mask=first_ok, other=0.0)
    part_first = tl.load(
        acc_ptr + (base + c * G)[:, None] * DH + d[None, :], mask=first_ok[:, None] & (d[None, :] < DH), other=0.0
    )
    m_all = tl.load(m_ptr + base + s * G, mask=s < SPLITS, other=float("-inf"))  # [SPLITS_PAD]
    m_max = tl.max(m_all, axis=0)
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty: every weight is 0
    used = tl.max(tl.where(m_all > float("-inf"), s + 1, 0), axis=0)
    weight = tl.exp2(m_first - m_ref)  # empty split: 0
    den = tl.sum(weight * l_first, axis=0)[None]
    num = tl.sum(weight[:, None] * part_first, axis=0)
    for first in range(CHUNK, used, CHUNK):
        split = first + c  # [CHUNK]
        ok = split < used
        row = base + split * G
        weight = tl.exp2(tl.load(m_ptr + row, mask=ok, other=float("-inf")) - m_ref)
        den += tl.sum(weight * tl.load(l_ptr + row, mask=ok, other=0.0), axis=0)
        part = tl.load(acc_ptr + row[:, None] * DH + d[None, :], mask=ok[:, None] & (d[None, :] < DH), other=0.0)
        num += tl.sum(weight[:, None] * part, axis=0)
    return num / tl.where(den > 0.0, den, 1.0)


@triton.jit
def paged_decode_combine_kernel(
    acc_ptr,
    m_ptr,
    l_ptr,
    out_ptr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    DH: tl.constexpr,
    DH_PAD: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
):
    # acc [B, HKV, SPLITS, G, DH], m, l [B, HKV, SPLITS, G] fp32 (the partials kernel's) -> out [B, HQ, DH] in
    # out's dtype; one program per (row, query head)
    b = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, DH_PAD)
    out = _combine_head(acc_ptr, m_ptr, l_ptr, b, head, d, HKV, G, DH, SPLITS, SPLITS_PAD, CHUNK)
    tl.store(out_ptr + (b * HQ + head) * DH + d, out.to(out_ptr.dtype.element_ty), mask=d < DH)


@triton.jit
def paged_decode_combine_quant_kernel(
    acc_ptr,
    m_ptr,
    l_ptr,
    out_ptr,
    qa_ptr,
    da_ptr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    DH: tl.constexpr,
    DH_PAD: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    Q6: tl.constexpr,
    ASM: tl.constexpr,
    TERMS: tl.constexpr = 1,
):
    # the same merge, and the output row [B, HQ * DH] also as the int8 activations of the projection reading it
    # (triton_act_quant's: qa int32 [B, TERMS HQ DH / 4], da fp32 [B, HQ DH / 32, 4 TERMS] for Q4_K, or Q6_K
    # when Q6). DH is a power of two >= 32 (so DH_PAD == DH), each 32-block lying in one head. The head's
    # elements are taken in the packed order (packed_order's e3 within each block): the merged values are then
    # already the [DH / 32, 4, 8] tile the quantizer takes, rounded to out's dtype first as the separate
    # quantizer would read them.
    b = tl.program_id(0)
    head = tl.program_id(1)
    f = tl.arange(0, DH)  # position in the packed tile [DH / 32, 4 (byte j), 8 (word w)]
    j, w = (f % 32) // 8, f % 8
    if Q6:
        d = (f // 32) * 32 + 16 * (w // 4) + 4 * j + w % 4
    else:
        d = f  # Q4_K's packing keeps each block's element order
    out = _combine_head(acc_ptr, m_ptr, l_ptr, b, head, d, HKV, G, DH, SPLITS, SPLITS_PAD, CHUNK)
    out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + (b * HQ + head) * DH + d, out)
    j3, e3 = packed_order(Q6)
    blocks = head * (DH // 32) + tl.arange(0, DH // 32)
    quantize_store(
        tl.reshape(out.to(tl.float32), [DH // 32, 4, 8]),
        qa_ptr,
        da_ptr,
        b,
        blocks,
        blocks >= 0,
        j3,
        e3,
        HQ * DH,
        ASM,
        TERMS,
    )
