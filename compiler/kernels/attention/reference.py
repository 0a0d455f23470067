"""Causal attention over a paged KV pool (reference), with the KV write of the step's own tokens.

Pool layout: one pool per layer, k_pool, v_pool [num_blocks, block_size, hkv, dh] (a separate buffer
per layer, so each step writes each buffer once, in place). Block 0 is reserved: padding rows write
there and no sequence reads it.

Sliding-window layers have their own, smaller pool (a state kind of their own): blocks wholly before a
sequence's window are handed back and its table holds block 0 there. Reading block 0 is harmless: every
position of such a block is older than `position - window + 1` for every query that can still run (the
runtime only drops a block once the earliest query it will ever compute again is past it, chunked
prefill included), so the mask gives it probability exactly 0, and 0 * (finite padding KV) adds exact
zeros: the output is bitwise what the untrimmed table gives.
"""

import jax
import jax.numpy as jnp

from ember.compiler.batch import StepBatch, kind_view


def window_size(*, window) -> int:
    """Per-layer constant: the sliding window in tokens (0 = unlimited)."""
    return int(window or 0)


def state_index(*, index) -> int:
    """Per-layer constant: which state kind (KV pool, block tables) the layer's attention uses."""
    return int(index or 0)


def paged_attention(q, k, v, window, state, k_pool, v_pool, batch: StepBatch, *, scale):
    # q [N, hq, dh], k/v [N, hkv, dh], window: int32 scalar (0 = unlimited), state: int32 scalar (kind index);
    # k_pool, v_pool: this layer's pool, of its state kind
    return attend_rows_and_segments(_attend_gathered, q, k, v, window, state, k_pool, v_pool, batch, scale=scale)


def _attend_gathered(q, positions, tables, k_pool, v_pool, window, scale):
    # every row's whole table gathered: [R, W * block_size] positions
    slots = _table_slots(tables, k_pool.shape[1])
    return _attend(q, _gather(k_pool, slots), _gather(v_pool, slots), positions, window, scale)


def attend_rows_and_segments(attend, q, k, v, window, state, k_pool, v_pool, batch: StepBatch, *, scale):
    """The step's k/v written into this layer's pools, then `attend(q [R, T, hq, dh], positions [R, T], tables
    [R, W], k_pool, v_pool, window, scale) -> [R, T, hq, dh]` over the B decode rows (one token each) and the
    P prefill segments (L tokens each) -> (out [N, hq * dh], k_pool, v_pool)."""
    write_slots, dec_tables, pre_tables = kind_view(batch, state)
    k_pool = _write(k_pool, write_slots, k)
    v_pool = _write(v_pool, write_slots, v)
    # the readers below see the written pools as they are: without the barrier XLA:CPU fuses a one-row write
    # into the gathers that read it and then copies each whole pool twice to keep the donated buffer intact
    # (the 1.5B's decode step at 177 blocks: 76 ms against 47 ms at 12)
    k_pool, v_pool = jax.lax.optimization_barrier((k_pool, v_pool))
    n_dec = batch.num_decode
    parts = []
    if n_dec:
        parts.append(
            attend(q[:n_dec, None], batch.positions[:n_dec, None], dec_tables, k_pool, v_pool, window, scale)[:, 0]
        )
    if q.shape[0] > n_dec:
        p = pre_tables.shape[0]
        positions = batch.positions[n_dec:].reshape(p, -1)
        segs = attend(q[n_dec:].reshape(p, -1, *q.shape[1:]), positions, pre_tables, k_pool, v_pool, window, scale)
        parts.append(segs.reshape(-1, *q.shape[1:]))
    out = jnp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    return out.reshape(out.shape[0], -1), k_pool, v_pool


def to_pool_dtype(x, dtype):
    """x rounded to a KV pool's dtype (to nearest even); an FP8 (e4m3) pool saturates at its largest finite value
    (448) rather than turning larger values into NaN, as the GPU kernels' conversions (cvt ... satfinite) do."""
    if jnp.dtype(dtype) == jnp.float8_e4m3fn:
        largest = float(jnp.finfo(jnp.float8_e4m3fn).max)
        x = jnp.clip(x, -largest, largest)
    return x.astype(dtype)


def _write(pool, slots, x):
    # scatter into the 4-D pool directly (no reshape of the pool: keeps the write in place)
    block_size = pool.shape[1]
    return pool.at[slots // block_size, slots % block_size].set(to_pool_dtype(x, pool.dtype))


def _table_slots(block_tables, block_size):
    # [R, max_blocks] -> [R, max_blocks * block_size] flat slot of every context position
    offsets = jnp.arange(block_size, dtype=jnp.int32)
    return (block_tables[:, :, None] * block_size + offsets).reshape(block_tables.shape[0], -1)


def _gather(pool, slots):
    block_size = pool.shape[1]
    return pool[slots // block_size, slots % block_size]  # [R, S, hkv, dh]


def _attend(q, k, v, positions, window, scale):
    # q [R, T, hq, dh]; k, v [R, S, hkv, dh]; positions [R, T] -> [R, T, hq, dh]
    r, t, hq, dh = q.shape
    hkv = k.shape[2]
    qg = q.reshape(r, t, hkv, hq // hkv, dh).astype(jnp.float32)
    scores = jnp.einsum("rtkgd,rskd->rkgts", qg, k.astype(jnp.float32)) * scale
    s = jnp.arange(k.shape[1], dtype=jnp.int32)
    visible = s[None, None, :] <= positions[:, :, None]  # causal: [R, T, S]
    visible &= (window <= 0) | (s[None, None, :] > positions[:, :, None] - window)
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("rkgts,rskd->rtkgd", probs, v.astype(jnp.float32))
    return out.reshape(r, t, hq, dh).astype(q.dtype)
