"""prefill_attention: prefill chunks' attention over the paged KV cache, as a flash-attention kernel.

The reference (`attention.paged_attention`) gathers the sequence's whole table into [S = W * bs] keys
and materialises fp32 scores [hkv, G, C, S]; at a 16k prefill that is gigabytes. Here:
  prefill_attention           the Triton kernel (prefill_kernel.py), a native XLA kernel; NVIDIA GPUs only
  prefill_attention_emulated  the same tiling, tile ranges, masks and online softmax in plain jnp (any
                              backend): what the CPU property tests check against the reference
  launch_plan / pick_config   the static launch parameters; pure, testable anywhere

Contract (both functions): q [C, hq, dh] (roped, activation dtype), k_pool/v_pool [blocks, bs, hkv, dh] with
the chunks' own K/V already written, block_table [W] int32 (one chunk) or [P, W] (P segments: q's rows
are P runs of L = C / P tokens, run s one chunk of the sequence whose table is row s), positions [C] int32
(consecutive from each chunk's first token; padding rows hold 0, as runtime/execution/step_inputs.py writes them),
num_tokens (int32 scalar, one chunk only, or None to derive each chunk's from positions), window (int32
scalar, 0 = unlimited: a query at p sees keys in (p - window, p]), scale (float) -> [C, hq, dh] in q's
dtype. Rows past a chunk's tokens are finite (they compute as its last valid token, or are 0 when their
whole tile is padding) and meant to be ignored. The segments run in one launch (grid axis 0 covers
P x row tiles).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp

LOG2E = 1.4426950408889634
NEG_INIT = -1.0e30  # as in the kernel
H200_SMS = 132
MAX_SPLITS = 16
MIN_TILES_PER_SPLIT = 8  # at the table's full width: do not split a walk shorter than this many KV tiles


@dataclass(frozen=True)
class PrefillAttentionConfig:
    block_m: int = 128  # packed (token, group head) rows per program; a power of two >= 16
    block_n: int = 64  # keys per KV tile; a power of two >= 16 (any page size)
    num_warps: int = 8
    num_stages: int = 3
    kv_splits: int | None = None  # programs per (row tile, kv head) along KV; None: from the grid size
    # > 0: batch-invariant splits of this many absolute KV tiles (block_m kept, partials always, combined in
    # a fixed order): the deterministic plans' attention (attention/invariant.py)
    split_tiles: int = 0


def pick_config(head_dim: int, dtype) -> PrefillAttentionConfig:
    """Starting points (FA2-on-Hopper habits); `tools/dev/bench_prefill_attention.py --sweep` measures them."""
    if jnp.dtype(dtype) == jnp.float32:  # ieee dots run on CUDA cores: smaller tiles, fewer registers
        return PrefillAttentionConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    if head_dim <= 64:
        return PrefillAttentionConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    if head_dim <= 128:
        return PrefillAttentionConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
    return PrefillAttentionConfig(block_m=64, block_n=32, num_warps=8, num_stages=2)


@dataclass(frozen=True)
class LaunchPlan:
    grid: tuple[int, int, int]  # (segments x row tiles, kv heads, kv splits)
    block_m: int
    block_n: int
    splits: int
    meta: dict  # the kernel's constexprs (besides IEEE)


def launch_plan(
    chunk: int,
    hq: int,
    hkv: int,
    head_dim: int,
    page: int,
    table_width: int,
    *,
    scale: float,
    config: PrefillAttentionConfig,
    segments: int = 1,
) -> LaunchPlan:
    """chunk: tokens per segment (L); segments: P chunks of L tokens in one launch."""
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not split into {hkv} KV head groups")
    for name, value in (("head_dim", head_dim), ("block_m", config.block_m), ("block_n", config.block_n)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    rows = chunk * (hq // hkv)
    block_m = max(16, min(config.block_m, 1 << (rows - 1).bit_length()))  # no more rows than the chunk has
    if config.split_tiles:  # the same tile shape (and so the same rounding) for a decode row as for a chunk
        block_m = config.block_m
    m_tiles = -(-rows // block_m)
    splits = config.kv_splits
    max_tiles = -(-table_width * page // config.block_n)
    if config.split_tiles:
        splits = -(-max_tiles // config.split_tiles)
    elif splits is None:
        programs = segments * m_tiles * hkv
        splits = (
            1
            if programs >= H200_SMS
            else min(MAX_SPLITS, -(-2 * H200_SMS // programs), max(1, max_tiles // MIN_TILES_PER_SPLIT))
        )
    if splits < 1:
        raise ValueError(f"kv_splits must be >= 1, got {splits}")
    meta = dict(
        C=chunk,
        SEGMENTS=segments,
        HQ=hq,
        HKV=hkv,
        DH=head_dim,
        PAGE=page,
        TABLE_W=table_width,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        SPLITS=splits,
        QK_SCALE=float(scale) * LOG2E,
        SPLIT_TILES=config.split_tiles,
    )
    return LaunchPlan((segments * m_tiles, hkv, splits), block_m, config.block_n, splits, meta)


def chunk_info(positions, num_tokens, window) -> jax.Array:
    """positions [..., C] of chunks -> int32 [..., 3] = [first position, valid tokens, window] per chunk, on
    device (no host sync).

    num_tokens None: the valid rows are the leading run with positions[i] == positions[0] + i (padding rows
    hold position 0, and a chunk's positions are consecutive, so the run ends at the first padding row)."""
    positions = jnp.asarray(positions, jnp.int32)
    start = positions[..., 0]
    if num_tokens is None:
        steps = positions == start[..., None] + jnp.arange(positions.shape[-1], dtype=jnp.int32)
        num_tokens = jnp.sum(jnp.cumprod(steps.astype(jnp.int32), axis=-1), axis=-1)
    num_tokens = jnp.broadcast_to(jnp.asarray(num_tokens, jnp.int32), start.shape)
    window = jnp.broadcast_to(jnp.asarray(window, jnp.int32), start.shape)
    return jnp.stack([start, num_tokens, window], axis=-1)


def combine_splits(acc, m, l):
    """acc fp32 [S, C, hq, dh] unnormalised, m / l [S, C, hq] (log2 domain) -> fp32 [C, hq, dh]."""
    m_all = jnp.max(m, axis=0)
    weight = jnp.exp2(m - m_all[None])  # [S, C, hq]; an empty split (l = 0) adds nothing
    l_all = jnp.sum(l * weight, axis=0)
    out = jnp.sum(acc * weight[..., None], axis=0)
    return out / jnp.where(l_all > 0.0, l_all, 1.0)[..., None]


def combine_splits_in_order(acc, m, l):
    """combine_splits in split order, elementwise: a row's rounding never depends on the rows beside it."""
    m_all = m[0]
    for s in range(1, m.shape[0]):
        m_all = jnp.maximum(m_all, m[s])
    l_all, out = jnp.zeros_like(l[0]), jnp.zeros_like(acc[0])
    for s in range(m.shape[0]):
        weight = jnp.exp2(m[s] - m_all)  # an empty split (l = 0, acc = 0, m = NEG_INIT) adds exact zeros
        l_all, out = l_all + l[s] * weight, out + acc[s] * weight[..., None]
    return out / jnp.where(l_all > 0.0, l_all, 1.0)[..., None]


def _combine(acc, m, l, config: PrefillAttentionConfig):
    return (combine_splits_in_order if config.split_tiles else combine_splits)(acc, m, l)


def _check_shapes(q, k_pool, v_pool, block_table, positions, num_tokens=None):
    c, hq, dh = q.shape
    if k_pool.shape != v_pool.shape or k_pool.ndim != 4 or k_pool.shape[3] != dh:
        raise ValueError(f"pools {k_pool.shape} / {v_pool.shape} do not match q {q.shape}")
    if block_table.ndim not in (1, 2) or positions.shape != (c,):
        raise ValueError(f"block_table {block_table.shape} must be [W] or [P, W], positions {positions.shape} [C={c}]")
    if block_table.ndim == 2 and (c % block_table.shape[0] or (num_tokens is not None and block_table.shape[0] > 1)):
        raise ValueError(f"{c} rows do not split into {block_table.shape[0]} segments (or num_tokens was given)")
    if q.dtype not in (jnp.bfloat16, jnp.float16, jnp.float32):
        raise ValueError(f"q must be bf16, f16 or f32, got {q.dtype}")


def _segment_tables(block_table) -> jax.Array:
    return block_table[None] if block_table.ndim == 1 else block_table  # [P, W]


def _plan_for(q, k_pool, block_table, scale, config) -> tuple[LaunchPlan, PrefillAttentionConfig]:
    c, hq, dh = q.shape
    _, page, hkv, _ = k_pool.shape
    tables = _segment_tables(block_table)
    config = config or pick_config(dh, q.dtype)
    plan = launch_plan(
        c // tables.shape[0], hq, hkv, dh, page, tables.shape[1], scale=scale, config=config, segments=tables.shape[0]
    )
    return plan, config


def prefill_attention(
    q,
    k_pool,
    v_pool,
    block_table,
    positions,
    num_tokens,
    window,
    *,
    scale,
    config: PrefillAttentionConfig | None = None,
):
    """The Triton kernel (see the module docstring for the contract). Jittable; one kernel launch (plus a
    small XLA combine when the plan splits KV)."""
    from ember.compiler.kernels.attention.prefill_kernel import prefill_attention_kernel
    from ember.compiler.kernels.triton.launch import (
        triton_call,  # Triton itself is imported on use (GPU-only dependency)
    )

    _check_shapes(q, k_pool, v_pool, block_table, positions, num_tokens)
    if q.shape[0] == 0:  # a step without a chunk
        return q
    plan, config = _plan_for(q, k_pool, block_table, scale, config)
    c, hq, dh = q.shape
    tables = _segment_tables(block_table)
    p = tables.shape[0]
    info = chunk_info(positions.reshape(p, -1), num_tokens, window)  # [P, 3]
    if plan.splits == 1 and not config.split_tiles:
        out_shape = [
            jax.ShapeDtypeStruct((c, hq, dh), q.dtype),
            jax.ShapeDtypeStruct((1,), jnp.float32),
            jax.ShapeDtypeStruct((1,), jnp.float32),
        ]
    else:
        out_shape = [
            jax.ShapeDtypeStruct((plan.splits, c, hq, dh), jnp.float32),
            jax.ShapeDtypeStruct((plan.splits, c, hq), jnp.float32),
            jax.ShapeDtypeStruct((plan.splits, c, hq), jnp.float32),
        ]
    out, m, l = triton_call(
        q,
        k_pool,
        v_pool,
        tables.astype(jnp.int32),
        info,
        kernel=prefill_attention_kernel,
        out_shape=out_shape,
        grid=plan.grid,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        IEEE=q.dtype == jnp.float32,
        **plan.meta,
    )
    if plan.splits == 1 and not config.split_tiles:
        return out
    return _combine(out, m, l, config).astype(q.dtype)


# ---- the same algorithm in jnp ------------------------------------------------------------------------


def tile_ranges(pid_m, split, start, n_tok, window, *, block_m, block_n, group, splits, split_tiles=0):
    """The kernel's KV tile ranges of one program: (s_begin, mid_begin, mid_end, s_end); tiles
    [s_begin, mid_begin) and [mid_end, s_end) are masked, [mid_begin, mid_end) unmasked. Works on jnp
    scalars (the emulation) and Python ints (tests); the kernel has the same lines in Triton."""
    w = jnp if isinstance(start, jax.Array) or isinstance(pid_m, jax.Array) else _PyOps
    n_rows = n_tok * group
    first_row = pid_m * block_m
    last_row = w.minimum(first_row + block_m - 1, n_rows - 1)
    q_lo = start + first_row // group
    q_hi = start + last_row // group
    key_end = w.where(first_row < n_rows, q_hi + 1, 0)
    key_begin = w.where(window > 0, w.maximum(q_lo - window + 1, 0), 0)
    key_begin = w.minimum(key_begin, key_end)
    j_begin = key_begin // block_n
    j_end = (key_end + block_n - 1) // block_n
    if split_tiles:
        s_begin = w.minimum(w.maximum(j_begin, split * split_tiles), j_end)
        s_end = w.minimum(w.maximum(j_begin, (split + 1) * split_tiles), j_end)
    else:
        per_split = (j_end - j_begin + splits - 1) // splits
        s_begin = w.minimum(j_begin + split * per_split, j_end)
        s_end = w.minimum(s_begin + per_split, j_end)
    full_begin = w.where(window > 0, (w.maximum(q_hi - window + 1, 0) + block_n - 1) // block_n, 0)
    full_end = (q_lo + 1) // block_n
    mid_begin = w.minimum(w.maximum(full_begin, s_begin), s_end)
    mid_end = w.minimum(w.maximum(full_end, mid_begin), s_end)
    return s_begin, mid_begin, mid_end, s_end


class _PyOps:
    minimum, maximum = staticmethod(min), staticmethod(max)
    where = staticmethod(lambda c, a, b: a if c else b)


def prefill_attention_emulated(
    q,
    k_pool,
    v_pool,
    block_table,
    positions,
    num_tokens,
    window,
    *,
    scale,
    config: PrefillAttentionConfig | None = None,
):
    """The kernel's algorithm in jnp: same packing, tile ranges, split shares, masks, fp32 online softmax
    (base 2), P rounded to q's dtype before PV, and the same combine. Slow; for tests and CPU checks.
    Segments run one after another, each with the split count the segmented launch gives it."""
    _check_shapes(q, k_pool, v_pool, block_table, positions, num_tokens)
    if q.shape[0] == 0:
        return q
    if block_table.ndim == 2:
        plan, config = _plan_for(q, k_pool, block_table, scale, config)
        one = replace(config, kv_splits=plan.splits)
        p = block_table.shape[0]
        return jnp.concatenate(
            [
                prefill_attention_emulated(seg_q, k_pool, v_pool, table, seg_pos, None, window, scale=scale, config=one)
                for seg_q, table, seg_pos in zip(jnp.split(q, p), block_table, jnp.split(positions, p))
            ]
        )
    plan, config = _plan_for(q, k_pool, block_table, scale, config)
    c, hq, dh = q.shape
    _, page, hkv, _ = k_pool.shape
    group, bm, bn, splits = hq // hkv, plan.block_m, plan.block_n, plan.splits
    m_tiles = plan.grid[0]
    start, n_tok, win = chunk_info(positions, num_tokens, window)
    table = block_table.astype(jnp.int32)
    num_keys = table.shape[0] * page
    qk_scale = plan.meta["QK_SCALE"]
    # packed rows per kv head: [hkv, m_tiles * bm, dh], row r = token r // G, head h * G + r % G
    packed = q.reshape(c, hkv, group, dh).transpose(1, 0, 2, 3).reshape(hkv, c * group, dh)
    packed = jnp.pad(packed, ((0, 0), (0, m_tiles * bm - c * group), (0, 0)))

    # one entry per kernel program (kv head, row tile, split), flattened: P = hkv * m_tiles * splits
    kv_head, pid_m, split = (
        a.reshape(-1) for a in jnp.meshgrid(jnp.arange(hkv), jnp.arange(m_tiles), jnp.arange(splits), indexing="ij")
    )
    rows = pid_m[:, None] * bm + jnp.arange(bm, dtype=jnp.int32)  # [P, bm]
    q_tiles = packed.reshape(hkv, m_tiles, bm, dh)[kv_head, pid_m].astype(jnp.float32)  # [P, bm, dh]
    q_pos = start + jnp.minimum(rows // group, n_tok - 1)  # [P, bm]
    s_begin, mid_begin, mid_end, s_end = tile_ranges(
        pid_m,
        split,
        start,
        n_tok,
        win,
        block_m=bm,
        block_n=bn,
        group=group,
        splits=splits,
        split_tiles=config.split_tiles,
    )  # each [P]

    def body(step, carry):  # program p folds tile s_begin[p] + step while that is below s_end[p]
        acc, m_i, l_i = carry
        j = s_begin + step  # [P]
        active = j < s_end
        masked = (j < mid_begin) | (j >= mid_end)  # [mid_begin, mid_end) skips the masks, as in the kernel
        keys = j[:, None] * bn + jnp.arange(bn, dtype=jnp.int32)  # [P, bn]
        block = table[jnp.minimum(keys // page, table.shape[0] - 1)]
        block = jnp.where(masked[:, None] & (keys >= num_keys), 0, block)
        k = k_pool[block, keys % page, kv_head[:, None]].astype(q.dtype).astype(jnp.float32)  # [P, bn, dh]
        v = v_pool[block, keys % page, kv_head[:, None]].astype(q.dtype).astype(jnp.float32)
        s = jnp.einsum("pmd,pnd->pmn", q_tiles, k, precision=jax.lax.Precision.HIGHEST) * qk_scale
        visible = keys[:, None, :] <= q_pos[:, :, None]  # [P, bm, bn]
        visible &= (win <= 0) | (keys[:, None, :] > q_pos[:, :, None] - win)
        s = jnp.where(visible | ~masked[:, None, None], s, -jnp.inf)
        m_new = jnp.maximum(m_i, s.max(axis=2))
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.exp2(s - m_new[..., None])
        l_new = l_i * alpha + p.sum(axis=2)
        p = p.astype(q.dtype).astype(jnp.float32)  # the kernel feeds P to the PV dot in q's dtype
        acc_new = acc * alpha[..., None] + jnp.einsum("pmn,pnd->pmd", p, v, precision=jax.lax.Precision.HIGHEST)
        keep = lambda new, old: jnp.where(active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)
        return keep(acc_new, acc), keep(m_new, m_i), keep(l_new, l_i)

    programs = kv_head.shape[0]
    carry = (
        jnp.zeros((programs, bm, dh), jnp.float32),
        jnp.full((programs, bm), NEG_INIT, jnp.float32),
        jnp.zeros((programs, bm), jnp.float32),
    )
    acc, m, l = jax.lax.fori_loop(0, jnp.max(s_end - s_begin), body, carry)
    # [P, bm, ...] -> [S, C, hq, ...] (packed rows back to (token, head))

    def unpack(x):
        rest = x.shape[2:]  # (dh,) or ()
        x = jnp.moveaxis(x.reshape(hkv, m_tiles, splits, bm, *rest), 2, 0)
        x = x.reshape(splits, hkv, m_tiles * bm, *rest)[:, :, : c * group]
        x = x.reshape(splits, hkv, c, group, *rest).swapaxes(1, 2)
        return x.reshape(splits, c, hq, *rest)

    if splits == 1 and not config.split_tiles:  # as the kernel: normalise directly
        acc, l = unpack(acc)[0], unpack(l)[0]
        return (acc / jnp.where(l > 0.0, l, 1.0)[..., None]).astype(q.dtype)
    return _combine(unpack(acc), unpack(m), unpack(l), config).astype(q.dtype)


__all__ = [
    "PrefillAttentionConfig",
    "LaunchPlan",
    "pick_config",
    "launch_plan",
    "chunk_info",
    "combine_splits",
    "combine_splits_in_order",
    "prefill_attention",
    "prefill_attention_emulated",
    "tile_ranges",
]
