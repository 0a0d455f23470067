"""One program's split of a decode row's attention (decode_kernel.py's kernels call `attend_split`): the
visible token range of a row, the K/V tile loads from the paged pool, and the online softmax over the split's
tiles. decode_kernel.py's module docstring describes the grid, the split and the tiles. Imports only triton.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def visible_range(ctx_ptr, pos_ptr, window_ptr, b, MAX_TOKENS: tl.constexpr):
    """[start, end) of the tokens row b's query may see (start <= end; empty when end == 0)."""
    ctx = tl.load(ctx_ptr + b)
    pos = tl.load(pos_ptr + b)
    window = tl.load(window_ptr)
    end = tl.maximum(tl.minimum(tl.minimum(ctx, pos + 1), MAX_TOKENS), 0)
    start = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    return tl.minimum(start, end), end


@triton.jit
def load_kv_tile(ptr, rows, d, mask, DOT_DTYPE: tl.constexpr):
    """The [BLOCK_N, DH_PAD] tile of K or V at int64 row offsets `rows`, in the dot's dtype (0 where masked).
    Quantized KV dequantizes here."""
    return tl.load(ptr + rows[:, None] + d[None, :], mask=mask, other=0.0).to(DOT_DTYPE)


@triton.jit
def attend_tile(
    q,
    k_ptr,
    v_ptr,
    table_ptr,
    b,
    h,
    t,
    end,
    d,
    m,
    l,
    acc,
    w_own,
    QK_SCALE: tl.constexpr,
    HKV: tl.constexpr,
    DH: tl.constexpr,
    DH_PAD: tl.constexpr,
    BS: tl.constexpr,
    W: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    own_pos,
    s_own,
    OWN: tl.constexpr,
):
    """One iteration of the online softmax: tokens t [BLOCK_N] (masked at >= end) folded into (m, l, acc).
    OWN: token own_pos is not read from the pool (masked: 0, so stale or NaN values cannot leak in): its
    score is s_own [G_PAD] (q . k_own, before QK_SCALE) and its weight, rounded to the dot dtype as p is for
    the dot, accumulates in w_own [G_PAD] (rescaled as acc is), for the caller to add w_own * v_own once."""
    valid = t < end
    block = tl.load(table_ptr + b * W + t // BS, mask=valid, other=0)
    # pool [num_blocks, BS, HKV, DH]: int64 before the multiply by the block stride
    rows = block.to(tl.int64) * (BS * HKV * DH) + ((t % BS) * (HKV * DH) + h * DH)
    if OWN:
        own = t == own_pos  # [BLOCK_N]
        kv_mask = (valid & (t != own_pos))[:, None]
    else:
        kv_mask = valid[:, None]
    if DH_PAD != DH:
        kv_mask = kv_mask & (d[None, :] < DH)
    k = load_kv_tile(k_ptr, rows, d, kv_mask, DOT_DTYPE)  # [BLOCK_N, DH_PAD]
    v = load_kv_tile(v_ptr, rows, d, kv_mask, DOT_DTYPE)
    if DOT_FP32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if OWN:
        s = tl.where(own[None, :], s_own[:, None], s)
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
    if OWN:
        w_own = w_own * alpha + tl.sum(tl.where(own[None, :], p, 0.0), axis=1).to(DOT_DTYPE).to(tl.float32)
    return m_new, l, acc * alpha[:, None] + pv, w_own


@triton.jit
def attend_split(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    ctx_ptr,
    pos_ptr,
    window_ptr,
    b,
    h,
    split,
    QK_SCALE: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    DH: tl.constexpr,
    DH_PAD: tl.constexpr,
    BS: tl.constexpr,
    W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    q_tile=None,
    s_own=None,
    v_own=None,
    visible=None,
    OWN: tl.constexpr = False,
):
    """Online softmax of q heads h*G .. h*G+G-1 of row b over split `split` of its visible tokens.
    Returns (acc [G_PAD, DH_PAD] unnormalized, m [G_PAD] running max in log2 units, l [G_PAD] sum).
    OWN (the RoPE-fused partials): q is `q_tile` [G_PAD, DH_PAD] (already rotated) and the row's own token
    (position pos[b], its last visible one: ctx_len == position + 1) is not read from the pool, which another
    program of this launch may not have written yet: its scores are `s_own` [G_PAD], its V row `v_own`
    [DH_PAD] (in the pool's dtype); `visible` is visible_range's (start, end), loaded by the caller up front."""
    if DOT_FP32:
        DOT_DTYPE: tl.constexpr = tl.float32
    elif k_ptr.dtype.element_ty.is_fp8():
        DOT_DTYPE: tl.constexpr = tl.float16  # e4m3 -> f16 is one cvt per two values (-> bf16: several)
    else:
        DOT_DTYPE: tl.constexpr = q_ptr.dtype.element_ty
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, DH_PAD)
    if OWN:
        q = q_tile.to(DOT_DTYPE)
    else:
        q_mask = g[:, None] < G
        if DH_PAD != DH:
            q_mask = q_mask & (d[None, :] < DH)
        q = tl.load(q_ptr + (b * HQ + h * G + g)[:, None] * DH + d[None, :], mask=q_mask, other=0.0)
        q = q.to(DOT_DTYPE)  # [G_PAD, DH_PAD]; padded rows are 0 and never stored

    if OWN:
        start, end = visible
    else:
        start, end = visible_range(ctx_ptr, pos_ptr, window_ptr, b, W * BS)
    n_iters = tl.cdiv(end - start, BLOCK_N)
    per_split = tl.cdiv(n_iters, SPLITS)
    it_lo = split * per_split
    it_hi = tl.minimum(it_lo + per_split, n_iters)

    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, DH_PAD], tl.float32)
    n = tl.arange(0, BLOCK_N)
    w_own = tl.zeros([G_PAD], tl.float32)
    for it in range(it_lo, it_hi):
        m, l, acc, w_own = attend_tile(
            q,
            k_ptr,
            v_ptr,
            table_ptr,
            b,
            h,
            start + it * BLOCK_N + n,
            end,
            d,
            m,
            l,
            acc,
            w_own,
            QK_SCALE,
            HKV,
            DH,
            DH_PAD,
            BS,
            W,
            DOT_FP32,
            DOT_DTYPE,
            end - 1,
            s_own,
            OWN,
        )
    if OWN:  # the own token's weighted V row, once: [G_PAD, DH_PAD]
        acc += w_own[:, None] * v_own.to(DOT_DTYPE).to(tl.float32)[None, :]
    return acc, m, l
