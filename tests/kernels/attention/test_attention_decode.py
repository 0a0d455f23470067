"""The split-K decode attention algorithm on CPU: its jnp emulation (decode.split_k_partials_jnp +
combine_partials, the kernel's visible range, per-split shares and BLOCK_N iterations) against the
reference `_attend`, and the h200 op entry (paged.py, emulation path) against the reference op.
The Triton kernel itself: test_decode_interpret.py and test_decode_fused_interpret.py (interpreter) and
test_attention_gpu.py (GPU)."""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.attention import (
    DecodeAttentionConfig,
    combine_partials,
    decode_launch_plan,
    paged_attention_emulated,
    paged_decode_attention,
)
from ember.compiler.kernels.attention.reference import _attend, _gather, _table_slots, paged_attention

emulated_decode = jax.jit(
    functools.partial(paged_decode_attention, backend="emulate"), static_argnames=("scale", "config", "splits")
)
reference_decode = jax.jit(
    lambda q, k_pool, v_pool, tables, pos, window, scale: _attend(
        q[:, None],
        _gather(k_pool, _table_slots(tables, k_pool.shape[1])),
        _gather(v_pool, _table_slots(tables, k_pool.shape[1])),
        pos[:, None],
        window,
        scale,
    )[:, 0],
    static_argnames="scale",
)
entry = jax.jit(paged_attention_emulated, static_argnames="scale")
reference_op = jax.jit(paged_attention, static_argnames="scale")

# every example compiles its own shapes (~3 s each on a CI core): the explicit examples plus a couple of
# generated ones in CI, EMBER_ATTENTION_EXAMPLES=50 for a wider sweep by hand (no shrinking: every shrink
# step recompiles, and a failing example is already small)
EXAMPLES = int(os.environ.get("EMBER_ATTENTION_EXAMPLES", 2))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate))


def decode_case(seed: int, hq: int, hkv: int, dh: int, block_size: int, window: int, ctx: list[int], spare: int = 1):
    """Pools of random values, scattered blocks, ragged contexts (positions = ctx - 1). `tables` lists every
    block (what the reference reads); `trimmed` holds block 0 where a block lies wholly before the window
    (a sliding kind's table), and `nan_pools` fill block 0 with NaN: a walk that skips dropped blocks (and
    never multiplies masked lanes) gives the untrimmed result from them."""
    rng = np.random.default_rng(seed)
    b = len(ctx)
    width = -(-max(ctx) // block_size) + spare
    blocks = 1 + rng.permutation(b * width).reshape(b, width)
    pools = rng.standard_normal((2, 1 + b * width, block_size, hkv, dh)).astype(np.float32)
    trimmed = blocks.copy()
    if window:
        for r, n in enumerate(ctx):
            trimmed[r, : max(0, n - window) // block_size] = 0
    nan_pools = pools.copy()
    nan_pools[:, 0] = np.nan
    q = rng.standard_normal((b, hq, dh)).astype(np.float32)
    ctx = np.asarray(ctx, np.int32)
    return dict(
        q=jnp.asarray(q),
        pools=jnp.asarray(pools),
        nan_pools=jnp.asarray(nan_pools),
        tables=jnp.asarray(blocks, jnp.int32),
        trimmed=jnp.asarray(trimmed, jnp.int32),
        ctx=jnp.asarray(ctx),
        pos=jnp.asarray(ctx - 1),
        window=jnp.int32(window),
    )


group_heads = st.sampled_from([(g * hkv, hkv) for g in (1, 4, 6, 8) for hkv in (1, 2)])
head_dims = st.sampled_from([64, 128])
block_sizes = st.sampled_from([16, 32])
windows = st.sampled_from([0, 1, 5, 24])
contexts = st.lists(st.integers(1, 130), min_size=1, max_size=4)


@SETTINGS
@given(
    group_heads,
    head_dims,
    block_sizes,
    windows,
    contexts,
    st.integers(1, 8),
    st.sampled_from([16, 64]),
    st.integers(0, 2**31 - 1),
)
@example((12, 2), 128, 16, 24, [130, 1, 47, 16], 8, 16, 3)  # G 6, sliding, ragged, a 1-token row, 8 splits
@example((8, 1), 64, 32, 0, [128, 33, 64], 3, 16, 4)  # G 8, several iterations per split, block boundaries
@example((4, 1), 128, 16, 40, [120, 75], 2, 16, 5)  # G 4, a window start inside a block, 2 iterations per split
def test_emulation_matches_reference(heads, dh, block_size, window, ctx, splits, block_n, seed):
    case = decode_case(seed, *heads, dh, block_size, window, ctx)
    scale = 1.0 / math.sqrt(dh)
    want = reference_decode(case["q"], *case["pools"], case["tables"], case["pos"], case["window"], scale=scale)
    config = DecodeAttentionConfig(block_n=block_n)
    got = emulated_decode(
        case["q"],
        *case["pools"],
        case["tables"],
        case["ctx"],
        case["pos"],
        case["window"],
        scale=scale,
        config=config,
        splits=splits,
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=1e-5)
    # a sliding kind's trimmed table over NaN-filled block 0: dropped blocks are never read
    sliding = emulated_decode(
        case["q"],
        *case["nan_pools"],
        case["trimmed"],
        case["ctx"],
        case["pos"],
        case["window"],
        scale=scale,
        config=config,
        splits=splits,
    )
    if window:
        np.testing.assert_array_equal(np.asarray(sliding), np.asarray(got))


def test_combine_ignores_empty_splits():
    rng = np.random.default_rng(0)
    b, hkv, s, g, dh = 2, 2, 3, 4, 8
    acc = jnp.asarray(rng.standard_normal((b, hkv, s, g, dh)), jnp.float32)
    m = jnp.asarray(rng.standard_normal((b, hkv, s, g)), jnp.float32)
    l = jnp.asarray(rng.uniform(1.0, 5.0, (b, hkv, s, g)), jnp.float32)
    combine = jax.jit(combine_partials, static_argnums=3)
    base = combine(acc, m, l, jnp.float32)
    # two empty splits (m = -inf, l = 0, acc = 0), one first, one last
    pad = lambda a, value: jnp.concatenate([jnp.full_like(a[:, :, :1], value), a, jnp.full_like(a[:, :, :1], value)], 2)
    padded = combine(pad(acc, 0.0), pad(m, -jnp.inf), pad(l, 0.0), jnp.float32)
    np.testing.assert_array_equal(np.asarray(padded), np.asarray(base))
    # log-sum-exp weights: a split's partials rescaled by exp2(c) with m raised by c give the same result
    shifted = combine(acc * 2.0, m + 1.0, l * 2.0, jnp.float32)
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(base), rtol=1e-5, atol=1e-6)
    # every split empty (no visible token) gives 0, not NaN
    empty = combine(jnp.zeros_like(acc), jnp.full_like(m, -jnp.inf), jnp.zeros_like(l), jnp.float32)
    assert not np.any(np.asarray(empty))


@pytest.mark.parametrize(
    "batch,hkv,width", [(1, 2, 2048), (1, 8, 2048), (32, 2, 2048), (32, 8, 2048), (256, 8, 2048), (4, 2, 8), (1, 1, 1)]
)
def test_launch_plan_splits(batch, hkv, width):
    config = DecodeAttentionConfig()
    plan = decode_launch_plan(batch, 4 * hkv, hkv, 128, 16, width, dot_fp32=False, config=config)
    s = plan["splits"]
    assert 1 <= s <= config.max_splits and plan["grid"] == (batch, hkv, s)
    assert s <= max(1, -(-width * 16 // config.min_split_tokens))  # no split shorter than the minimum
    target = config.num_sms * config.programs_per_sm
    if s < config.max_splits and s < -(-width * 16 // config.min_split_tokens):
        assert batch * hkv * s >= target  # enough programs, unless a cap bound the split count
        assert s == 1 or batch * hkv * (s - 1) < target  # and no more than needed
    assert ("SPLITS" in plan["meta"]) == (s > 1)
    assert decode_launch_plan(batch, 4 * hkv, hkv, 128, 16, width, dot_fp32=False, splits=3)["splits"] == 3


def test_launch_plan_pads_heads():
    plan = decode_launch_plan(2, 12, 2, 80, 16, 64, dot_fp32=True)
    meta = plan["meta"]
    assert (meta["G"], meta["G_PAD"], meta["DH"], meta["DH_PAD"]) == (6, 16, 80, 128)
    wide = decode_launch_plan(2, 4, 1, 256, 16, 64, dot_fp32=False)
    assert wide["block_n"] == DecodeAttentionConfig().block_n // 2  # same tile bytes for wider heads
    fp8 = decode_launch_plan(2, 12, 2, 128, 16, 64, dot_fp32=False, kv_itemsize=1)
    assert fp8["block_n"] == 2 * DecodeAttentionConfig().block_n  # ... and for FP8 pools
    with pytest.raises(ValueError):
        decode_launch_plan(2, 12, 5, 128, 16, 64, dot_fp32=False)


def _step_batch(rng, decode_ctx, chunk, block_size, width, kinds, state, window):
    """A StepBatch: decode rows at ctx - 1, then a prefill chunk (start, count) of one more sequence; the
    step's tokens get slots in their sequences' blocks; this layer's kind at row `state` (block 0 elsewhere)."""
    seqs = len(decode_ctx) + 1
    blocks = 1 + rng.permutation(seqs * width).reshape(seqs, width)
    rows = [(s, n - 1) for s, n in enumerate(decode_ctx)]
    if chunk:
        rows += [(seqs - 1, chunk[0] + i) for i in range(chunk[1])]
    slot = lambda s, p: blocks[s, p // block_size] * block_size + p % block_size

    def trim(s, earliest):  # a sliding kind hands back blocks wholly before its earliest query's window
        table = blocks[s].copy()
        if window:
            table[: max(0, earliest - window + 1) // block_size] = 0
        return table

    per_kind = lambda a: jnp.asarray(np.stack([a if i == state else np.zeros_like(a) for i in range(kinds)]), jnp.int32)
    batch = StepBatch(
        tokens=jnp.zeros(len(rows), jnp.int32),
        positions=jnp.asarray([p for _, p in rows], jnp.int32),
        slots=per_kind(np.asarray([slot(s, p) for s, p in rows])),
        dec_block_tables=per_kind(np.asarray([trim(s, n - 1) for s, n in enumerate(decode_ctx)]).reshape(-1, width)),
        dec_ctx_lens=jnp.asarray(decode_ctx, jnp.int32),
        pre_block_table=per_kind((trim(seqs - 1, chunk[0]) if chunk else np.zeros(width, np.int64))[None]),
        logit_rows=jnp.zeros(1, jnp.int32),
    )
    return batch, len(rows), 1 + seqs * width


@settings(SETTINGS, max_examples=max(1, EXAMPLES // 2))
@given(
    st.sampled_from([(4, 1), (12, 2), (8, 2)]),
    st.sampled_from([0, 6]),
    st.lists(st.integers(1, 70), max_size=3),
    st.none() | st.tuples(st.integers(0, 40), st.integers(1, 9)),
    st.integers(0, 2**31 - 1),
)
@example((12, 2), 6, [70, 1, 33], (21, 9), 1)  # decode rows beside a chunk, sliding, state kind 1 of 2
def test_entry_matches_reference_op(heads, window, decode_ctx, chunk, seed):
    if not decode_ctx and chunk is None:
        decode_ctx = [9]
    hq, hkv = heads
    dh, block_size, width = 64, 16, 8
    rng = np.random.default_rng(seed)
    batch, n, num_blocks = _step_batch(rng, decode_ctx, chunk, block_size, width, kinds=2, state=1, window=window)
    q = jnp.asarray(rng.standard_normal((n, hq, dh)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((n, hkv, dh)), jnp.float32) for _ in range(2))
    pools = [jnp.asarray(rng.standard_normal((num_blocks, block_size, hkv, dh)), jnp.float32) for _ in range(2)]
    args = (q, k, v, jnp.int32(window), jnp.float32(1), *pools, batch)
    got, got_k, got_v = entry(*args, scale=0.125)
    want, want_k, want_v = reference_op(*args, scale=0.125)
    assert got.shape == want.shape == (n, hq * dh)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=1e-5)
    for got_pool, want_pool in ((got_k, want_k), (got_v, want_v)):  # the reference's KV write, bit for bit
        assert np.array_equal(np.asarray(got_pool), np.asarray(want_pool))
