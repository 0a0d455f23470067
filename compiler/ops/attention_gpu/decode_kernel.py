"""Triton kernels: split-K ("flash-decoding") attention of decode rows over the paged KV pool.

Imports only triton (and the activation quantizer's Triton helpers), so Triton's CPU interpreter can run these
kernels on numpy buffers
(tools/check_attention_kernels.py); decode.py launches them (as native XLA kernels, ../triton_launch.py).

What one program computes. Grid (B, hkv, SPLITS): program (b, h, s) takes decode row b, KV head h and
the s-th share of the row's visible tokens, and folds them into an online softmax for all G = hq / hkv
query heads of that KV head (GQA), so each K/V tile is read from HBM once per step, not G times.

  visible tokens  [start, end): end = min(ctx_len, position + 1, W * block_size) (only written positions
                  exist, causal is implied), start = max(0, position - window + 1) with a window, else 0.
                  The walk starts AT `start`: tokens before the window, and the block-0 entries a sliding
                  table holds where blocks were handed back, are never loaded (a sliding layer costs
                  O(window) bytes, not O(context)).
  splits          the range is cut into BLOCK_N-token iterations, and split s walks iterations
                  [s * per, min((s + 1) * per, n)) with per = ceil(n / SPLITS): the split is over the
                  row's own length (device data), not the static table width, so a short row in an
                  engine with a long max_model_len still spreads over all splits; iterations past the
                  row leave a split empty (m = -inf, l = 0, acc = 0, which the combine weighs by 0).
  iteration       BLOCK_N consecutive tokens t; each token's block id is read from the table (t // bs),
                  its [dh] K and V rows gathered with int64 offsets (num_blocks * bs * hkv * dh may pass
                  2**31), masked past `end` (masked lanes are not loaded, so garbage or NaN in unread slots
                  cannot leak in). The token walk is independent of block_size: loads stay BLOCK_N rows wide
                  whether blocks hold 16 tokens or 256, and a window start inside a block wastes no lanes.
  math            scores = q @ K^T [G_PAD, BLOCK_N] by tl.dot, kept in log2 units (QK_SCALE is
                  scale * log2(e), so exp2 is the softmax's exp; a constexpr: one compiled kernel per model,
                  where a Python-float argument would reach the kernel as fp64 through jax-triton 0.3.1);
                  running max m, sum l and acc [G_PAD, dh] are fp32; acc += p @ V by tl.dot. An all-masked
                  tile leaves the state unchanged (m stays -inf without exp(-inf - -inf) = NaN: the
                  reference max is 0 while nothing is visible).

Why tl.dot with G padded to G_PAD = max(16, next power of two) query rows rather than broadcasting FMAs:
G is 1-8 for the models we run, and a broadcast q[:, None, :] * K[None] product is a [G, BLOCK_N, dh] fp32
temporary (G * 32 registers per thread at 4 warps for 64 x 128 tiles) plus a cross-lane reduction over dh
for every score. mma.sync with 16 rows costs 16 / G of useful tensor-core work, but tensor-core throughput
is ~100x what the HBM stream needs at decode (2 * G flops per K/V element loaded), the fp32 state stays
[16, dh] per program, and K/V tiles sit in shared memory in the layout mma wants (which also lets Triton
pipeline them with cp.async across iterations: num_stages).

Precision. bf16 (or fp16) q and pool: q @ K^T multiplies bf16 values exactly into an fp32 accumulator;
p is rounded to the pool dtype for p @ V (as flash attention does: ~2**-9 relative per weight, below the
bf16 output rounding). Any fp32 operand (DOT_FP32): everything is converted to fp32 and both dots run with
input_precision="ieee" (no TF32 rounding), matching the reference to fp32 rounding.

Quantized KV later (int8 / fp8): `_load_kv_tile` is the one place a tile enters the kernel; a per-block or
per-token scale pointer and a dequantize into the dot dtype go there, the rest is unchanged.

Outputs. paged_decode_partials_kernel writes unnormalized fp32 partials acc [B, hkv, SPLITS, G, dh] and
m, l [B, hkv, SPLITS, G] (m in log2 units) that paged_decode_combine_kernel merges with log-sum-exp weights
(decode.combine_partials is the same merge in jnp).
paged_decode_kernel is the SPLITS = 1 case (large batches): it normalizes in-kernel and writes
[B, hq, dh] in the output dtype, so the step has one launch and no combine op.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..quant.triton_act_quant import packed_order, quantize_store


@triton.jit
def _visible_range(ctx_ptr, pos_ptr, window_ptr, b, MAX_TOKENS: tl.constexpr):
    """[start, end) of the tokens row b's query may see (start <= end; empty when end == 0)."""
    ctx = tl.load(ctx_ptr + b)
    pos = tl.load(pos_ptr + b)
    window = tl.load(window_ptr)
    end = tl.maximum(tl.minimum(tl.minimum(ctx, pos + 1), MAX_TOKENS), 0)
    start = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    return tl.minimum(start, end), end


@triton.jit
def _load_kv_tile(ptr, rows, d, mask, DOT_DTYPE: tl.constexpr):
    """The [BLOCK_N, DH_PAD] tile of K or V at int64 row offsets `rows`, in the dot's dtype (0 where masked).
    Quantized KV dequantizes here."""
    return tl.load(ptr + rows[:, None] + d[None, :], mask=mask, other=0.0).to(DOT_DTYPE)


@triton.jit
def _attend_split(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, pos_ptr, window_ptr, b, h, split,
                  QK_SCALE: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
                  DH: tl.constexpr, DH_PAD: tl.constexpr, BS: tl.constexpr, W: tl.constexpr,
                  BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, DOT_FP32: tl.constexpr):
    """Online softmax of q heads h*G .. h*G+G-1 of row b over split `split` of its visible tokens.
    Returns (acc [G_PAD, DH_PAD] unnormalized, m [G_PAD] running max in log2 units, l [G_PAD] sum)."""
    if DOT_FP32:
        DOT_DTYPE: tl.constexpr = tl.float32
    else:
        DOT_DTYPE: tl.constexpr = k_ptr.dtype.element_ty
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, DH_PAD)
    q_mask = g[:, None] < G
    if DH_PAD != DH:
        q_mask = q_mask & (d[None, :] < DH)
    q = tl.load(q_ptr + (b * HQ + h * G + g)[:, None] * DH + d[None, :], mask=q_mask, other=0.0)
    q = q.to(DOT_DTYPE)  # [G_PAD, DH_PAD]; padded rows are 0 and never stored

    start, end = _visible_range(ctx_ptr, pos_ptr, window_ptr, b, W * BS)
    n_iters = tl.cdiv(end - start, BLOCK_N)
    per_split = tl.cdiv(n_iters, SPLITS)
    it_lo = split * per_split
    it_hi = tl.minimum(it_lo + per_split, n_iters)

    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, DH_PAD], tl.float32)
    n = tl.arange(0, BLOCK_N)
    for it in range(it_lo, it_hi):
        t = start + it * BLOCK_N + n  # [BLOCK_N] token positions
        valid = t < end
        block = tl.load(table_ptr + b * W + t // BS, mask=valid, other=0)
        # pool [num_blocks, BS, HKV, DH]: int64 before the multiply by the block stride
        rows = block.to(tl.int64) * (BS * HKV * DH) + ((t % BS) * (HKV * DH) + h * DH)
        kv_mask = valid[:, None]
        if DH_PAD != DH:
            kv_mask = kv_mask & (d[None, :] < DH)
        k = _load_kv_tile(k_ptr, rows, d, kv_mask, DOT_DTYPE)  # [BLOCK_N, DH_PAD]
        v = _load_kv_tile(v_ptr, rows, d, kv_mask, DOT_DTYPE)
        if DOT_FP32:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(valid[None, :], s * QK_SCALE, float("-inf"))  # [G_PAD, BLOCK_N], log2 units
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet: p and alpha stay 0
        alpha = tl.exp2(m - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if DOT_FP32:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(DOT_DTYPE), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    return acc, m, l


@triton.jit
def paged_decode_partials_kernel(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, pos_ptr, window_ptr,
                                 acc_ptr, m_ptr, l_ptr, QK_SCALE: tl.constexpr,
                                 HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
                                 DH: tl.constexpr, DH_PAD: tl.constexpr, BS: tl.constexpr, W: tl.constexpr,
                                 BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, DOT_FP32: tl.constexpr):
    # q [B, HQ, DH]; k, v [num_blocks, BS, HKV, DH]; table [B, W] int32; ctx, pos [B] int32; window [1] int32
    # -> acc [B, HKV, SPLITS, G, DH], m, l [B, HKV, SPLITS, G] fp32
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    acc, m, l = _attend_split(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, pos_ptr, window_ptr, b, h, split,
                              QK_SCALE, HQ, HKV, G, G_PAD, DH, DH_PAD, BS, W, BLOCK_N, SPLITS, DOT_FP32)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, DH_PAD)
    row = ((b * HKV + h) * SPLITS + split) * G + g  # [G_PAD] partial row of each query head
    tl.store(m_ptr + row, m, mask=g < G)
    tl.store(l_ptr + row, l, mask=g < G)
    tl.store(acc_ptr + row[:, None] * DH + d[None, :], acc, mask=(g[:, None] < G) & (d[None, :] < DH))


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, pos_ptr, window_ptr, out_ptr,
                        QK_SCALE: tl.constexpr,
                        HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
                        DH: tl.constexpr, DH_PAD: tl.constexpr, BS: tl.constexpr, W: tl.constexpr,
                        BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr):
    # the single-split case: same inputs -> out [B, HQ, DH] in out's dtype (a row that sees nothing gets 0)
    b = tl.program_id(0)
    h = tl.program_id(1)
    acc, m, l = _attend_split(q_ptr, k_ptr, v_ptr, table_ptr, ctx_ptr, pos_ptr, window_ptr, b, h, 0,
                              QK_SCALE, HQ, HKV, G, G_PAD, DH, DH_PAD, BS, W, BLOCK_N, 1, DOT_FP32)
    out = acc / tl.where(l > 0.0, l, 1.0)[:, None]
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, DH_PAD)
    ptrs = out_ptr + (b * HQ + h * G + g)[:, None] * DH + d[None, :]
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=(g[:, None] < G) & (d[None, :] < DH))


@triton.jit
def _combine_head(acc_ptr, m_ptr, l_ptr, b, head, d, HKV: tl.constexpr, G: tl.constexpr, DH: tl.constexpr,
                  SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """Query head `head` of row b merged over its splits, at the head's elements `d` (any order; >= DH: 0):
    decode.combine_partials' formula, with M = max_s m_s, sum_s exp2(m_s - M) acc_s / sum_s exp2(m_s - M) l_s
    (0 where nothing was visible). Only splits up to the last non-empty one are read (a short row in a wide
    table fills a few of its SPLITS), CHUNK of them per tile, so a long row's 64 splits cost a few dependent
    loads, not 64."""
    base = ((b * HKV + head // G) * SPLITS) * G + head % G  # partial row of split 0; split s: + s * G
    s = tl.arange(0, SPLITS_PAD)
    m_all = tl.load(m_ptr + base + s * G, mask=s < SPLITS, other=float("-inf"))  # [SPLITS_PAD]
    m_max = tl.max(m_all, axis=0)
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty: every weight is 0
    used = tl.max(tl.where(m_all > float("-inf"), s + 1, 0), axis=0)
    c = tl.arange(0, CHUNK)
    num = tl.zeros(d.shape, tl.float32)
    den = tl.zeros([1], tl.float32)
    for first in range(0, used, CHUNK):
        split = first + c  # [CHUNK]
        ok = split < used
        row = base + split * G
        weight = tl.exp2(tl.load(m_ptr + row, mask=ok, other=float("-inf")) - m_ref)  # empty split: 0
        den += tl.sum(weight * tl.load(l_ptr + row, mask=ok, other=0.0), axis=0)
        part = tl.load(acc_ptr + row[:, None] * DH + d[None, :], mask=ok[:, None] & (d[None, :] < DH), other=0.0)
        num += tl.sum(weight[:, None] * part, axis=0)
    return num / tl.where(den > 0.0, den, 1.0)


@triton.jit
def paged_decode_combine_kernel(acc_ptr, m_ptr, l_ptr, out_ptr, HQ: tl.constexpr, HKV: tl.constexpr,
                                G: tl.constexpr, DH: tl.constexpr, DH_PAD: tl.constexpr, SPLITS: tl.constexpr,
                                SPLITS_PAD: tl.constexpr, CHUNK: tl.constexpr):
    # acc [B, HKV, SPLITS, G, DH], m, l [B, HKV, SPLITS, G] fp32 (the partials kernel's) -> out [B, HQ, DH] in
    # out's dtype; one program per (row, query head)
    b = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, DH_PAD)
    out = _combine_head(acc_ptr, m_ptr, l_ptr, b, head, d, HKV, G, DH, SPLITS, SPLITS_PAD, CHUNK)
    tl.store(out_ptr + (b * HQ + head) * DH + d, out.to(out_ptr.dtype.element_ty), mask=d < DH)


@triton.jit
def paged_decode_combine_quant_kernel(acc_ptr, m_ptr, l_ptr, out_ptr, qa_ptr, da_ptr, HQ: tl.constexpr,
                                      HKV: tl.constexpr, G: tl.constexpr, DH: tl.constexpr, DH_PAD: tl.constexpr,
                                      SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, CHUNK: tl.constexpr,
                                      Q6: tl.constexpr, ASM: tl.constexpr):
    # the same merge, and the output row [B, HQ * DH] also as the int8 activations of the projection reading it
    # (triton_act_quant's: qa int32 [B, HQ * DH / 4], da fp32 [B, HQ * DH / 32, 4] packed for Q4_K, or Q6_K
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
    quantize_store(tl.reshape(out.to(tl.float32), [DH // 32, 4, 8]), qa_ptr, da_ptr, b, blocks, blocks >= 0,
                   j3, e3, HQ * DH, ASM)


KERNELS = {"partials": paged_decode_partials_kernel, "single": paged_decode_kernel,
           "combine": paged_decode_combine_kernel, "combine_quant": paged_decode_combine_quant_kernel}
