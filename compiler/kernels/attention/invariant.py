"""Batch-invariant paged attention for the deterministic plans of the GPU targets.

Every row of a step (decode rows, prefill chunks) goes through the prefill flash-attention kernel
(prefill_kernel.py) with one fixed configuration: decode rows as segments of one token, chunks as they are.
What makes a query's result the same bits alone, beside any other rows, as a decode row or inside a chunk of
any length or offset:
  - one tile shape for every launch (BLOCK_M packed rows x BLOCK_N keys, the same warps), so the same MMA and
    reduction instructions; a packed row's dot products and row reductions do not depend on the other rows
    of its tile;
  - KV walked in absolute tiles of BLOCK_N keys from position 0, split at fixed absolute tile boundaries
    (SPLIT_TILES) rather than in equal shares of a program's range; tiles past a query's position are fully
    masked for it and leave its running (m, l, acc) bitwise unchanged;
  - the splits merged elementwise in split order (prefill.combine_splits_in_order), never by a reduction
    whose order XLA picks from the operand's shape.
The split length bounds the walk of one program (batch-1 decode at long contexts runs its splits in
parallel) and the partials' size (SPLITS = table width / split length).

Traced for anything but an NVIDIA GPU (CI runs the h200 plans on CPU) it is the blockwise jnp attention,
batch-invariant by construction (blockwise.py). Same signature, pool layout and return value as
`attention.paged_attention`.
"""

from __future__ import annotations

import jax.numpy as jnp

from ember.compiler.batch import StepBatch, kind_view
from ember.compiler.kernels.attention.blockwise import paged_attention_blockwise
from ember.compiler.kernels.attention.prefill import PrefillAttentionConfig, prefill_attention
from ember.compiler.kernels.attention.reference import _write
from ember.compiler.kernels.triton.available import triton_available

# 64 packed rows: the smallest wgmma M (a decode row fills G of them); 2,048 keys per split
INVARIANT_CONFIG = PrefillAttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=2, split_tiles=32)


def paged_attention_invariant(q, k, v, window, state, k_pool, v_pool, batch: StepBatch, *, scale):
    # q [N, hq, dh], k/v [N, hkv, dh], window: int32 scalar (0 = unlimited), state: int32 scalar (kind index);
    # k_pool, v_pool: this layer's pool [num_blocks, block_size, hkv, dh] -> (out [N, hq * dh], k_pool, v_pool)
    if not triton_available():
        return paged_attention_blockwise(q, k, v, window, state, k_pool, v_pool, batch, scale=scale)
    write_slots, dec_tables, pre_tables = kind_view(batch, state)
    k_pool = _write(k_pool, write_slots, k)
    v_pool = _write(v_pool, write_slots, v)
    out = attend_invariant(q, k_pool, v_pool, dec_tables, pre_tables, batch.positions, batch.num_decode, window, scale)
    return out.reshape(out.shape[0], -1), k_pool, v_pool


def attend_invariant(q, k_pool, v_pool, dec_tables, pre_tables, positions, num_decode, window, scale, *, attend=None):
    """q [N, hq, dh] over pools already holding the step's K/V: the first num_decode rows decode (tables
    dec_tables [B, W], one token each), the rest are P chunks (pre_tables [P, W]) -> [N, hq, dh].
    attend: prefill_attention (default) or prefill.prefill_attention_emulated (the same algorithm in jnp)."""
    attend = attend or prefill_attention
    run = lambda rows, tables, pos: attend(
        rows, k_pool, v_pool, tables, pos, None, window, scale=scale, config=INVARIANT_CONFIG
    )
    parts = []
    if num_decode:  # B segments of one token
        parts.append(run(q[:num_decode], dec_tables, positions[:num_decode]))
    if q.shape[0] > num_decode:
        parts.append(run(q[num_decode:], pre_tables, positions[num_decode:]))
    return jnp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
