"""Batch-invariant causal attention over the paged KV pool: the deterministic-mode reference.

Why not `attention.paged_attention`: it gathers each row's whole block table into S = table width *
block_size positions and reduces over S. The table width follows the longest sequence in the step, so
the length (and XLA's reduction tree) of a row's softmax and PV sums changes with its neighbours;
masked positions add exact zeros, but in a different order, and the rounding differs.

Here every row walks its own KV blocks in table order, one block (block_size tokens) per loop step,
keeping an online softmax (running max m, sum l, accumulator acc). Each step reduces only over dh
(scores) and block_size (the block's sum and PV product), both fixed by the model and the pool, as
fixed pairwise trees of elementwise adds (`fixed_order_sum`; an einsum is not enough, see there),
and a block past the row's context leaves (m, l, acc) bitwise unchanged (see `_fold_block`). So a
row's result depends on its own query and its own context only — not on the table width, the number
of rows, what the other rows hold, or how its prompt was chunked (a decode row gives the same bits as
the same token inside a prefill chunk). Everything runs in fp32.

Cost on CPU (2-core Xeon, hq 12, hkv 2, dh 128, 64 blocks of 16): 16 decode rows about as fast as the
reference; a 256-token prefill chunk about 4-5x slower (elementwise sums instead of a gemm).

Same signature, pool layout and return value as `attention.paged_attention`: k_pool, v_pool
[num_blocks, block_size, hkv, dh] (this layer's, of its state kind); block 0 is reserved (padding rows
write there). A sliding kind's table holds block 0 for blocks dropped before the window: those blocks are
fully masked for every query, so they leave (m, l, acc) bitwise unchanged (`_fold_block`), as if unread.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.attention.reference import attend_rows_and_segments
from ember.compiler.kernels.fixed_order import fixed_order_sum

_F32 = jnp.float32


def paged_attention_blockwise(q, k, v, window, state, k_pool, v_pool, batch: StepBatch, *, scale):
    # q [N, hq, dh], k/v [N, hkv, dh], window: int32 scalar (0 = unlimited), state: int32 scalar (kind index);
    # this layer's pools k_pool, v_pool [blocks, bs, hkv, dh] -> (out [N, hq * dh], k_pool, v_pool), the
    # step's k/v written first
    # q, k, v computed once, before the pool write and the block walk: left to fuse, XLA recomputes their
    # producers (RoPE, a norm) inside those, in a form that differs at one row (XLA:CPU contracts multiply-adds
    # into FMAs within a fusion), so a lone decode row would round unlike the same row beside others
    q, k, v = jax.lax.optimization_barrier((q, k, v))
    return attend_rows_and_segments(_attend_blockwise, q, k, v, window, state, k_pool, v_pool, batch, scale=scale)


def _attend_blockwise(q, positions, tables, k_layer, v_layer, window, scale):
    # q [R, T, hq, dh]; positions [R, T]; tables [R, W] block ids; k_layer, v_layer [blocks, bs, hkv, dh]
    # -> [R, T, hq, dh]
    r, t, hq, dh = q.shape
    block_size, hkv = k_layer.shape[1], k_layer.shape[2]
    groups = hq // hkv  # GQA: query heads per KV head
    # dh leads: the fixed-order sums below add whole contiguous halves, which vectorise
    q_t = q.reshape(r, t, hkv, groups, dh).astype(_F32).transpose(4, 0, 2, 3, 1)  # [dh, R, hkv, g, T]
    offsets = jnp.arange(block_size, dtype=jnp.int32)

    def step(j, state):
        blocks = jax.lax.dynamic_index_in_dim(tables, j, axis=1, keepdims=False)  # [R]
        k_blk = jnp.take(k_layer, blocks, axis=0).astype(_F32)  # [R, bs, hkv, dh]
        v_blk = jnp.take(v_layer, blocks, axis=0).astype(_F32)
        # gather each block once: left free, XLA fuses the gather into every product element (~25% slower)
        k_blk, v_blk = jax.lax.optimization_barrier((k_blk, v_blk))
        key_pos = j * block_size + offsets  # [bs] position of each token of the row's j-th block
        visible = key_pos[None, None, :] <= positions[:, :, None]  # causal: [R, T, bs]
        visible &= (window <= 0) | (key_pos[None, None, :] > positions[:, :, None] - window)
        # scores: a sum over dh only, in a fixed order -> [R, hkv, g, T, bs]
        k_t = k_blk.transpose(3, 0, 2, 1)  # [dh, R, hkv, bs]
        scores = fixed_order_sum(q_t[..., None] * k_t[:, :, :, None, None, :]) * scale
        return _fold_block(state, scores, visible[:, None, None], v_blk)

    m0 = jnp.full((r, hkv, groups, t), -jnp.inf, _F32)  # running max of the scores seen
    l0 = jnp.zeros((r, hkv, groups, t), _F32)  # running sum of exp(score - m)
    acc0 = jnp.zeros((r, hkv, groups, t, dh), _F32)  # running sum of exp(score - m) * v
    # only the blocks some row of this call reaches: a block past a row's context leaves its state bitwise
    # unchanged (_fold_block), so stopping there gives every row the bits of the whole table's walk, while
    # a short context no longer walks the engine's longest one
    reached = jnp.clip(jnp.max(positions) // block_size + 1, 1, tables.shape[1])
    _, l, acc = jax.lax.fori_loop(0, reached, step, (m0, l0, acc0))
    # l > 0 for every real row (a query always sees itself); the guard keeps degenerate padding rows finite
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # [R, hkv, g, T, dh]
    return out.transpose(0, 3, 1, 2, 4).reshape(r, t, hq, dh).astype(q.dtype)


def _fold_block(state, scores, visible, v_blk):
    """One online-softmax step over one KV block.

    state (m, l [R, hkv, g, T], acc [R, hkv, g, T, dh]); scores [R, hkv, g, T, bs]; visible broadcastable
    to scores; v_blk [R, bs, hkv, dh].

    Why a fully masked block (past the row's context, or before its sliding window) changes nothing,
    bitwise: its scores are all -inf, so m_new = max(m, -inf) = m and `same` holds everywhere; the
    correction is then exactly 1.0 (selected, not computed, so it does not rely on exp(0) == 1), and
    every p is exactly 0 (exp(-inf - m_ref) = exp(-inf) = 0, and selected to 0 as well). So
    l * 1.0 + sum(0, ..., 0) == l and acc * 1.0 + sum(0 * v) == acc, because x + 0 == x exactly (also
    when fused into an FMA). This needs finite v in the masked slots, as the reference does (0 * inf is
    NaN there too): block 0 and unused slots hold padding rows' KV or the pool's initial zeros.
    No NaN on an all-masked first block: m = m_new = -inf would make exp(m - m_new) = exp(-inf + inf)
    = NaN, but `same` selects 1.0 there, and the exponent for p subtracts m_ref = 0 instead of -inf.
    """
    m, l, acc = state
    scores = jnp.where(visible, scores, -jnp.inf)
    m_new = jnp.maximum(m, scores.max(axis=-1))  # a max is exact in any order, so XLA may reduce it freely
    same = m_new == m
    m_ref = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # finite reference for the exponents
    correction = jnp.where(same, 1.0, jnp.exp(m - m_ref))  # exp(-inf - finite) = 0 when m was -inf
    p = jnp.where(visible, jnp.exp(scores - m_ref[..., None]), 0.0)  # [R, hkv, g, T, bs]
    p_t = jnp.moveaxis(p, -1, 0)  # [bs, R, hkv, g, T]
    l_new = l * correction + fixed_order_sum(p_t)
    # PV: a sum over the block's bs tokens only, in a fixed order -> [R, hkv, g, T, dh]
    v_t = v_blk.transpose(1, 0, 2, 3)[:, :, :, None, None, :]  # [bs, R, hkv, 1, 1, dh]
    acc_new = acc * correction[..., None] + fixed_order_sum(p_t[..., None] * v_t)
    return m_new, l_new, acc_new
