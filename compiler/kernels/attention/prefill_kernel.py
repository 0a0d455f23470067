"""Triton flash-attention kernel for prefill chunks over the paged KV cache (imports only triton).

Grid (SEGMENTS * M_TILES, HKV, SPLITS): SEGMENTS chunks of C tokens each (one sequence apiece, its own
block table row and info row), M_TILES row tiles per chunk. A program owns BLOCK_M *packed rows* of one KV head: packed row r is query
token r // G of the chunk and query head kv_head * G + r % G (G = HQ // HKV, the GQA group). Packing the
group into M, rather than one program per query head:
  - short chunks fill the tile: C = 16 with G = 8 gives 128 rows per K/V tile gathered; one program per
    query head would have 16 (an M = 16 dot wastes most of a 64-row wgmma, and each of the G programs
    would gather the whole prefix again), so packing does G x the math per gathered byte there;
  - for long chunks it costs nothing: the same number of programs, the same K/V bytes per program, and
    a thin causal diagonal (a tile spans BLOCK_M / G consecutive query positions);
  - G need not be a power of two (G = 6 works: r // G is integer math on the row index).

KV is walked in tiles of BLOCK_N consecutive key positions; key position p lives in pool block
table[p // PAGE], row p % PAGE, so any BLOCK_N works with any page size (a tile reads BLOCK_N / PAGE
table entries). Only tiles that some row of the program can see are visited: key positions
[max(0, q_lo - window + 1), q_hi] for the program's first and last query positions (all of
[0, q_hi] without a window), so the cost is the causal triangle plus the cached prefix, and O(window)
on sliding layers. Within that range the tiles every row sees completely (the middle) run without a
mask; the ragged ends (the window's edge, the diagonal) run the masked variant of the same loop.

Online softmax in fp32, base 2 (the scores are scaled by scale * log2(e) once). The running max starts
at -1e30, not -inf, so a row whose first tiles are all masked (a window edge) gets p = exp2(-inf) = 0
and a correction of 1, never exp2(-inf + inf) = NaN; empty programs (padding tiles, empty KV splits) keep
l = 0 and are written as 0 (SPLITS == 1) or as a split that the combine weighs by l = 0.

Chunk facts arrive in a tiny int32 device array (info [SEGMENTS, 3] = [start position, valid tokens, window]) so that one
compiled kernel serves every chunk of a bucket without a host sync. Rows of token >= valid tokens are
padding: they compute as if they were the last valid token (finite, reads only valid keys) and whole
padding tiles read nothing. Pool offsets are int64 (a pool can exceed 2**31 elements).

SPLITS > 1 (flash-decoding style, for short chunks over long prefixes, where M_TILES * HKV programs
cannot fill the GPU): split s takes an equal share of the program's KV tiles and writes its unnormalised
fp32 accumulator plus (m, l); the wrapper combines the splits. SPLITS == 1 normalises in the kernel.

SPLIT_TILES > 0 (the deterministic plans, attention/invariant.py): split s owns the absolute KV tiles
[s * SPLIT_TILES, (s + 1) * SPLIT_TILES) whatever the program's rows, and every split writes partials (even
SPLITS == 1), so a query's reduction order depends on its own position only: a decode row (a segment of one
token) and the same token inside a prefill chunk fold the same tiles into the same splits. Tiles past a row's
position are fully masked for it and leave (m, l, acc) bitwise unchanged (alpha = exp2(0) = 1, p = 0).
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_INIT = tl.constexpr(-1.0e30)  # running-max start: finite, so exp2 of (masked -inf) - NEG_INIT is 0, never NaN


@triton.jit
def _fold_kv_tiles(
    acc,
    m_i,
    l_i,
    q,
    k_pool_ptr,
    v_pool_ptr,
    table_ptr,
    kv_head,
    q_pos,
    window,
    j_begin,
    j_end,
    HKV: tl.constexpr,
    DH: tl.constexpr,
    PAGE: tl.constexpr,
    NUM_KEYS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    QK_SCALE: tl.constexpr,
    IEEE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Fold KV tiles j_begin .. j_end - 1 into (acc [BM, DH], m_i [BM], l_i [BM]) for queries q [BM, DH] at
    positions q_pos [BM]. MASKED applies the causal and window masks (and guards the table's end)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DH)
    for j in range(j_begin, j_end):
        keys = j * BLOCK_N + offs_n  # [BN] key positions of this tile
        if MASKED:
            block = tl.load(table_ptr + keys // PAGE, mask=keys < NUM_KEYS, other=0)
        else:  # every key of an unmasked tile is <= some valid query position, so inside the table
            block = tl.load(table_ptr + keys // PAGE)
        pool_row = (block.to(tl.int64) * PAGE + keys % PAGE) * HKV + kv_head  # [BN] row of [.., DH]
        offsets = pool_row[:, None] * DH + offs_d[None, :]  # [BN, DH] int64
        k = tl.load(k_pool_ptr + offsets).to(q.dtype)
        v = tl.load(v_pool_ptr + offsets).to(q.dtype)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * QK_SCALE  # [BM, BN] fp32, log2 domain
        if MASKED:
            visible = keys[None, :] <= q_pos[:, None]
            visible = visible & ((window <= 0) | (keys[None, :] > q_pos[:, None] - window))
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(q.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def prefill_attention_kernel(
    q_ptr,
    k_pool_ptr,
    v_pool_ptr,
    table_ptr,
    info_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    C: tl.constexpr,
    SEGMENTS: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    DH: tl.constexpr,
    PAGE: tl.constexpr,
    TABLE_W: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    QK_SCALE: tl.constexpr,
    IEEE: tl.constexpr,
    SPLIT_TILES: tl.constexpr,
):
    # q [SEGMENTS * C, HQ, DH]; pools [blocks, PAGE, HKV, DH]; table [SEGMENTS, TABLE_W] int32; info int32
    # [SEGMENTS, 3]. SPLITS == 1: out [SEGMENTS * C, HQ, DH] (q's dtype), m_ptr/l_ptr unused. SPLITS > 1: out
    # fp32 [SPLITS, SEGMENTS * C, HQ, DH] unnormalised, m/l fp32 [SPLITS, SEGMENTS * C, HQ].
    G: tl.constexpr = HQ // HKV
    M_TILES: tl.constexpr = (C * G + BLOCK_M - 1) // BLOCK_M
    segment = tl.program_id(0) // M_TILES
    pid_m = M_TILES - 1 - tl.program_id(0) % M_TILES  # the longest rows (latest queries) start first
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    table_ptr += segment * TABLE_W
    start = tl.load(info_ptr + segment * 3)
    n_tok = tl.load(info_ptr + segment * 3 + 1)
    window = tl.load(info_ptr + segment * 3 + 2)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # packed rows
    tok = rows // G
    head = kv_head * G + rows % G
    in_range = rows < C * G
    offs_d = tl.arange(0, DH)
    q_rows = (segment * C + tok).to(tl.int64) * HQ + head  # [BM] row of q / out viewed as [SEGMENTS * C * HQ, DH]
    q = tl.load(q_ptr + q_rows[:, None] * DH + offs_d[None, :], mask=in_range[:, None], other=0.0)
    q_pos = start + tl.minimum(tok, n_tok - 1)  # padding rows act as the last valid token

    # the KV tiles some row of this program sees: keys [key_begin, key_end)
    n_rows = n_tok * G
    first_row = pid_m * BLOCK_M
    last_row = tl.minimum(first_row + BLOCK_M - 1, n_rows - 1)
    q_lo = start + first_row // G
    q_hi = start + last_row // G
    key_end = tl.where(first_row < n_rows, q_hi + 1, 0)  # a tile of padding only reads nothing
    key_begin = tl.where(window > 0, tl.maximum(q_lo - window + 1, 0), 0)
    key_begin = tl.minimum(key_begin, key_end)
    j_begin = key_begin // BLOCK_N
    j_end = (key_end + BLOCK_N - 1) // BLOCK_N
    if SPLIT_TILES > 0:  # batch-invariant splits: split s owns absolute KV tiles [s, s + 1) * SPLIT_TILES
        s_begin = tl.minimum(tl.maximum(j_begin, split * SPLIT_TILES), j_end)
        s_end = tl.minimum(tl.maximum(j_begin, (split + 1) * SPLIT_TILES), j_end)
    else:  # an equal share of this program's tiles
        per_split = (j_end - j_begin + SPLITS - 1) // SPLITS
        s_begin = tl.minimum(j_begin + split * per_split, j_end)
        s_end = tl.minimum(s_begin + per_split, j_end)
    # tiles every row sees whole: after the window edge of the last query, before the first query's diagonal
    full_begin = tl.where(window > 0, (tl.maximum(q_hi - window + 1, 0) + BLOCK_N - 1) // BLOCK_N, 0)
    full_end = (q_lo + 1) // BLOCK_N
    mid_begin = tl.minimum(tl.maximum(full_begin, s_begin), s_end)
    mid_end = tl.minimum(tl.maximum(full_end, mid_begin), s_end)

    acc = tl.zeros([BLOCK_M, DH], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_INIT, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    num_keys: tl.constexpr = TABLE_W * PAGE
    acc, m_i, l_i = _fold_kv_tiles(
        acc,
        m_i,
        l_i,
        q,
        k_pool_ptr,
        v_pool_ptr,
        table_ptr,
        kv_head,
        q_pos,
        window,
        s_begin,
        mid_begin,
        HKV,
        DH,
        PAGE,
        num_keys,
        BLOCK_N,
        QK_SCALE,
        IEEE,
        True,
    )
    acc, m_i, l_i = _fold_kv_tiles(
        acc,
        m_i,
        l_i,
        q,
        k_pool_ptr,
        v_pool_ptr,
        table_ptr,
        kv_head,
        q_pos,
        window,
        mid_begin,
        mid_end,
        HKV,
        DH,
        PAGE,
        num_keys,
        BLOCK_N,
        QK_SCALE,
        IEEE,
        False,
    )
    acc, m_i, l_i = _fold_kv_tiles(
        acc,
        m_i,
        l_i,
        q,
        k_pool_ptr,
        v_pool_ptr,
        table_ptr,
        kv_head,
        q_pos,
        window,
        mid_end,
        s_end,
        HKV,
        DH,
        PAGE,
        num_keys,
        BLOCK_N,
        QK_SCALE,
        IEEE,
        True,
    )

    if SPLITS == 1 and SPLIT_TILES == 0:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + q_rows[:, None] * DH + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=in_range[:, None]
        )
    else:
        split_rows = split * (SEGMENTS * C * HQ) + q_rows  # [BM] row of the [SPLITS * SEGMENTS * C * HQ, ...] partials
        tl.store(out_ptr + split_rows[:, None] * DH + offs_d[None, :], acc, mask=in_range[:, None])
        tl.store(m_ptr + split_rows, m_i, mask=in_range)
        tl.store(l_ptr + split_rows, l_i, mask=in_range)
