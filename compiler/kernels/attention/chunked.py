"""Causal attention over the paged KV pool that reads only as far as the step's contexts reach: the cpu
target's default.

Why not `attention.paged_attention` (reference.py): it gathers every row's whole block table, the engine's
max_model_len positions, at every step and reduces over all of them. At `ember serve`'s default context
(32,768) a decode row with a few hundred tokens of context paid for 32k: the default model decoded 3.65
tok/s through the server, 5.27 with `--ctx 4096` (docs/cpu_target.md). Here each row's table is read in
chunks of CHUNK_BLOCKS blocks inside a loop that stops after the last chunk the step's longest context
reaches (a dynamic trip count: no recompile per length), the chunks merged by an online softmax (running
max m, sum l, accumulator acc), each chunk's scores and PV products as einsums (GEMMs for prefill chunks).
Everything in fp32; agrees with the reference to fp32 rounding (the sums' order differs).

Same signature, pool layout and return value as `attention.paged_attention`: q [N, hq, dh], k/v [N, hkv, dh],
k_pool, v_pool [num_blocks, block_size, hkv, dh] (this layer's, of its state kind); block 0 is reserved.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.attention.reference import attend_rows_and_segments

CHUNK_BLOCKS = 16  # 256 positions per chunk at block size 16
_F32 = jnp.float32


def paged_attention_chunked(q, k, v, window, state, k_pool, v_pool, batch: StepBatch, *, scale):
    # window: int32 scalar (0 = unlimited), state: int32 scalar (kind index)
    return attend_rows_and_segments(_attend_chunked, q, k, v, window, state, k_pool, v_pool, batch, scale=scale)


def _attend_chunked(q, positions, tables, k_pool, v_pool, window, scale):
    # q [R, T, hq, dh]; positions [R, T]; tables [R, W] block ids -> [R, T, hq, dh]
    r, t, hq, dh = q.shape
    block_size, hkv = k_pool.shape[1], k_pool.shape[2]
    groups = hq // hkv
    per_chunk = min(CHUNK_BLOCKS, tables.shape[1])
    chunks = -(-tables.shape[1] // per_chunk)
    # block 0 pads the last chunk: its positions lie past every row's context, so it is masked
    tables = jnp.pad(tables, ((0, 0), (0, chunks * per_chunk - tables.shape[1])))
    qg = q.reshape(r, t, hkv, groups, dh).astype(_F32)
    offsets = jnp.arange(per_chunk * block_size, dtype=jnp.int32)

    def step(c, carry):
        m, l, acc = carry
        blocks = jax.lax.dynamic_slice_in_dim(tables, c * per_chunk, per_chunk, axis=1)  # [R, per_chunk]
        keys = k_pool[blocks].reshape(r, -1, hkv, dh).astype(_F32)  # [R, S, hkv, dh]
        values = v_pool[blocks].reshape(r, -1, hkv, dh).astype(_F32)
        key_pos = c * per_chunk * block_size + offsets  # [S]
        visible = key_pos[None, None, :] <= positions[:, :, None]  # causal: [R, T, S]
        visible &= (window <= 0) | (key_pos[None, None, :] > positions[:, :, None] - window)
        scores = jnp.einsum("rtkgd,rskd->rkgts", qg, keys) * scale
        scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
        m_new = jnp.maximum(m, scores.max(axis=-1))
        m_ref = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # finite: a row with nothing visible yet stays at zero
        correction = jnp.exp(m - m_ref)  # 0 while m is -inf
        p = jnp.exp(scores - m_ref[..., None])  # masked scores give exactly 0
        l = l * correction + p.sum(axis=-1)
        acc = acc * correction[..., None] + jnp.einsum("rkgts,rskd->rkgtd", p, values)
        return m_new, l, acc

    m0 = jnp.full((r, hkv, groups, t), -jnp.inf, _F32)
    l0 = jnp.zeros((r, hkv, groups, t), _F32)
    acc0 = jnp.zeros((r, hkv, groups, t, dh), _F32)
    reached = jnp.clip(jnp.max(positions) // (per_chunk * block_size) + 1, 1, chunks)
    _, l, acc = jax.lax.fori_loop(0, reached, step, (m0, l0, acc0))
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # a padding row may see nothing: kept finite
    return out.transpose(0, 3, 1, 2, 4).reshape(r, t, hq, dh).astype(q.dtype)
