"""paged_attention_blockwise: agrees with the reference op, and a row's output is bitwise independent of the
table width, its neighbour rows and how its prefill is chunked (what deterministic mode needs)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from ember.compiler.batch import StepBatch
from ember.compiler.kernels.attention.blockwise import _fold_block, paged_attention_blockwise
from ember.compiler.kernels.attention.reference import paged_attention

MAX_LEN = 40  # tokens a test sequence may reach

blockwise = jax.jit(paged_attention_blockwise, static_argnames="scale")
reference = jax.jit(paged_attention, static_argnames="scale")


@dataclass(frozen=True)
class World:
    """Sequences and their KV blocks. A token's q/k/v depend only on (seed, sequence, position), so the same
    token gets the same inputs in every batch that holds it."""

    hq: int
    hkv: int
    dh: int
    block_size: int
    seed: int
    blocks: tuple[tuple[int, ...], ...]  # blocks[s]: sequence s's blocks, in order (never block 0)
    num_blocks: int

    def vectors(self, tag: int, seq: int, pos: int) -> np.ndarray:
        heads = self.hq if tag == 0 else self.hkv  # tag 0: q [hq, dh], 1: k, 2: v [hkv, dh]
        rng = np.random.default_rng([self.seed, tag, seq, pos])
        return rng.standard_normal((heads, self.dh)).astype(np.float32)

    def slot(self, seq: int, pos: int) -> int:
        return self.blocks[seq][pos // self.block_size] * self.block_size + pos % self.block_size

    def table(self, seq: int, width: int, dropped: int = 0) -> list[int]:
        # the runtime lists every allocated block (some may be past the context), then pads with block 0;
        # a sliding kind's table holds block 0 for its first `dropped` blocks (handed back)
        own = [0] * dropped + list(self.blocks[seq][dropped:width])
        return own + [0] * (width - len(own))


def make_world(seed: int, hq: int, hkv: int, dh: int, block_size: int, sequences: int, max_len: int = MAX_LEN) -> World:
    per_seq = -(-max_len // block_size) + 1  # one spare block past the longest context, holding garbage
    ids = np.random.default_rng(seed).permutation(np.arange(1, 1 + sequences * per_seq)).tolist()
    blocks = tuple(tuple(ids[s * per_seq : (s + 1) * per_seq]) for s in range(sequences))
    return World(hq, hkv, dh, block_size, seed, blocks, 1 + sequences * per_seq + 2)


def initial_pools(world: World, prior: dict[int, int]) -> tuple[jax.Array, jax.Array]:
    """Garbage everywhere (block 0 and unwritten slots included), then each sequence's first prior[s] tokens."""
    rng = np.random.default_rng(world.seed + 1)
    shape = (world.num_blocks, world.block_size, world.hkv, world.dh)  # one layer's pool
    pools = [rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(2)]
    for seq, count in prior.items():
        for pos in range(count):
            b, o = divmod(world.slot(seq, pos), world.block_size)
            for tag, pool in ((1, pools[0]), (2, pools[1])):
                pool[b, o] = world.vectors(tag, seq, pos)
    return jnp.asarray(pools[0]), jnp.asarray(pools[1])


def needed_blocks(world: World, pos: int) -> int:
    return pos // world.block_size + 1


def step(
    fn,
    world: World,
    pools,
    decode: list[tuple[int, int]],
    chunk: tuple[int, int, int] | None,
    window: int,
    width: int | None = None,
    *,
    trim: bool = False,
    kinds: int = 1,
    state: int = 0,
):
    """Run one step. decode: (sequence, position) rows; chunk: (sequence, first position, token count).
    trim: each table holds block 0 for the blocks wholly before its earliest query's window (what the
    runtime's sliding kind hands back); kinds/state: the batch has `kinds` rows of slots and tables, this
    layer's at row `state` (the others all block 0)."""
    rows = list(decode) + ([(chunk[0], chunk[1] + i) for i in range(chunk[2])] if chunk else [])
    need = max(needed_blocks(world, pos) for _, pos in rows)
    width = need if width is None else width
    assert width >= need
    q, k, v = (np.stack([world.vectors(tag, s, p) for s, p in rows]) for tag in range(3))

    def dropped(earliest: int) -> int:
        return max(0, (earliest - window + 1) // world.block_size) if trim and window else 0

    def per_kind(a) -> jnp.ndarray:  # this layer's kind at row `state`, block 0 elsewhere
        a = np.asarray(a, np.int32)
        return jnp.asarray(np.stack([a if i == state else np.zeros_like(a) for i in range(kinds)]))

    batch = StepBatch(
        tokens=jnp.zeros(len(rows), jnp.int32),
        positions=jnp.asarray([p for _, p in rows], jnp.int32),
        slots=per_kind([world.slot(s, p) for s, p in rows]),
        dec_block_tables=per_kind(
            np.asarray([world.table(s, width, dropped(p)) for s, p in decode], np.int32).reshape(-1, width)
        ),
        dec_ctx_lens=jnp.asarray([p + 1 for _, p in decode], jnp.int32),
        pre_block_table=per_kind([world.table(chunk[0], width, dropped(chunk[1])) if chunk else [0] * width]),
        logit_rows=jnp.zeros(1, jnp.int32),
    )
    out, k_pool, v_pool = fn(
        jnp.asarray(q),
        jnp.asarray(k),
        jnp.asarray(v),
        jnp.int32(window),
        jnp.float32(state),
        *pools,
        batch,
        scale=1.0 / math.sqrt(world.dh),
    )
    return np.asarray(out), (k_pool, v_pool)


head_shapes = st.sampled_from([(hq, hkv) for hq in (1, 2, 4) for hkv in (1, 2, 4) if hq % hkv == 0])
dims = st.sampled_from([8, 16])
block_sizes = st.sampled_from([4, 8, 16])
windows = st.sampled_from([0, 3, 8])
positions = st.integers(0, MAX_LEN - 1)
chunks = st.tuples(st.integers(0, 24), st.integers(1, 10))  # (first position, tokens)
seeds = st.integers(0, 2**31 - 1)
# each example compiles 2-4 programs (~1 s each on a CI core), so CI runs a few rich examples (several ragged
# rows each); EMBER_ATTENTION_EXAMPLES=50 runs a wider sweep by hand
# (no shrinking: every shrink step recompiles, and a failing example is already small)
SETTINGS = settings(
    max_examples=int(os.environ.get("EMBER_ATTENTION_EXAMPLES", 4)),
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),
)


@SETTINGS
@given(head_shapes, dims, block_sizes, windows, st.lists(positions, max_size=4), st.none() | chunks, seeds)
@example((4, 2), 16, 4, 3, [0, 37, 9], (13, 10), 5)  # GQA, window, ragged rows, a chunk across blocks
def test_matches_reference_op(heads, dh, block_size, window, dec_positions, chunk, seed):
    if not dec_positions and chunk is None:
        dec_positions = [5]
    world = make_world(seed, *heads, dh, block_size, len(dec_positions) + 1)
    decode = list(enumerate(dec_positions))
    pre = (len(decode), *chunk) if chunk else None
    prior = {s: p for s, p in decode} | ({pre[0]: pre[1]} if pre else {})
    pools = initial_pools(world, prior)
    got, got_pools = step(blockwise, world, pools, decode, pre, window)
    want, want_pools = step(reference, world, pools, decode, pre, window)
    assert got.shape == want.shape == (len(dec_positions) + (chunk[1] if chunk else 0), heads[0] * dh)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(got_pools, want_pools):
        assert np.array_equal(np.asarray(a), np.asarray(b))  # the same KV write


@SETTINGS
@given(head_shapes, dims, block_sizes, windows, st.lists(positions, min_size=1, max_size=3), st.none() | chunks, seeds)
@example((4, 2), 16, 4, 0, [39, 13, 7], (20, 5), 1)  # the reference op's bits do change here
def test_doubled_table_width_changes_no_bit(heads, dh, block_size, window, dec_positions, chunk, seed):
    world = make_world(seed, *heads, dh, block_size, len(dec_positions) + 1)
    decode = list(enumerate(dec_positions))
    pre = (len(decode), *chunk) if chunk else None
    pools = initial_pools(world, {s: p for s, p in decode} | ({pre[0]: pre[1]} if pre else {}))
    tight, _ = step(blockwise, world, pools, decode, pre, window)
    rows = [p for _, p in decode] + ([pre[1] + pre[2] - 1] if pre else [])
    need = max(needed_blocks(world, p) for p in rows)
    # the wider table lists each sequence's further (garbage-holding) blocks, then block 0
    doubled, _ = step(blockwise, world, pools, decode, pre, window, width=2 * need)
    assert np.array_equal(tight, doubled)


@SETTINGS
@given(
    head_shapes,
    dims,
    block_sizes,
    windows,
    positions,
    st.lists(positions, max_size=3),
    st.lists(positions, max_size=3),
    st.none() | chunks,
    seeds,
)
def test_decode_row_ignores_its_neighbours(heads, dh, block_size, window, pos, before, after, chunk, seed):
    others = before + after
    world = make_world(seed, *heads, dh, block_size, len(others) + 2)
    target = len(others)  # sequence ids: others are 0.., the target, then the prefill's sequence
    decode = [(s, p) for s, p in enumerate(before)] + [(target, pos)]
    decode += [(len(before) + i, p) for i, p in enumerate(after)]
    pre = (target + 1, *chunk) if chunk else None
    pools = initial_pools(world, {s: p for s, p in decode} | ({pre[0]: pre[1]} if pre else {}))
    alone, _ = step(blockwise, world, pools, [(target, pos)], None, window)
    crowded, _ = step(blockwise, world, pools, decode, pre, window)
    assert np.array_equal(alone[0], crowded[len(before)])


@SETTINGS
@given(
    head_shapes,
    dims,
    block_sizes,
    windows,
    st.integers(0, 24),
    st.integers(2, 12),
    st.integers(1, 11),
    st.lists(positions, max_size=2),
    seeds,
)
@example((4, 2), 16, 4, 3, 9, 12, 5, [30], 6)  # GQA, window, a chunk over four blocks, a decode neighbour
def test_prefill_chunking_changes_no_bit(heads, dh, block_size, window, start, count, split, dec_positions, seed):
    split = min(split, count - 1)  # the first chunk's tokens; the second chunk has the rest
    world = make_world(seed, *heads, dh, block_size, len(dec_positions) + 1)
    seq = len(dec_positions)
    decode = list(enumerate(dec_positions))  # other sequences decoding beside the chunk
    pools = initial_pools(world, {s: p for s, p in decode} | {seq: start})
    whole, pools_whole = step(blockwise, world, pools, [], (seq, start, count), window)
    first, pools_after = step(blockwise, world, pools, decode, (seq, start, split), window)
    second, _ = step(
        blockwise,
        world,
        pools_after,
        [],
        (seq, start + split, count - split),
        window,
        width=needed_blocks(world, MAX_LEN + 11),
    )  # also a wider table than needed
    chunked = np.concatenate([first[len(decode) :], second])
    assert np.array_equal(whole, chunked)
    # a chunk of one is a decode row: the chunk's last token recomputed as a decode step (as after a
    # preemption) beside another row gives the same bits
    last = start + count - 1
    redo, _ = step(blockwise, world, pools_whole, [(seq, last)] + decode[:1], None, window)
    assert np.array_equal(whole[-1], redo[0])


@SETTINGS
@given(head_shapes, dims, block_sizes, st.sampled_from([1, 3, 8]), st.lists(positions, max_size=3), chunks, seeds)
@example((4, 2), 16, 4, 3, [37, 9], (13, 10), 5)  # a chunk whose first query reaches back into a dropped block's
def test_sliding_kind_reading_block_0_for_dropped_blocks_changes_no_bit(
    heads, dh, block_size, window, dec_positions, chunk, seed
):
    """Both ops: tables holding block 0 (full of garbage) where a sliding kind dropped blocks before the
    earliest query's window — chunked prefill included — give the bits of the untrimmed tables, and a
    layer reads the kind row its state index names."""
    world = make_world(seed, *heads, dh, block_size, len(dec_positions) + 1)
    decode = list(enumerate(dec_positions))
    pre = (len(decode), *chunk)
    pools = initial_pools(world, {s: p for s, p in decode} | {pre[0]: pre[1]})
    for fn in (blockwise, reference):
        full, full_pools = step(fn, world, pools, decode, pre, window)
        trimmed, trimmed_pools = step(fn, world, pools, decode, pre, window, trim=True, kinds=2, state=1)
        assert np.array_equal(full, trimmed)
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(full_pools, trimmed_pools))


def test_masked_block_leaves_state_bitwise_unchanged():
    rng = np.random.default_rng(7)
    r, hkv, g, t, bs, dh = 2, 2, 3, 4, 8, 16
    m = jnp.asarray(rng.standard_normal((r, hkv, g, t)), jnp.float32)
    l = jnp.asarray(rng.uniform(0.5, 9.0, (r, hkv, g, t)), jnp.float32)
    acc = jnp.asarray(rng.standard_normal((r, hkv, g, t, dh)), jnp.float32)
    scores = jnp.asarray(rng.standard_normal((r, hkv, g, t, bs)) * 50, jnp.float32)
    v_blk = jnp.asarray(rng.standard_normal((r, bs, hkv, dh)) * 1e6, jnp.float32)
    none = jnp.zeros((r, 1, 1, t, bs), bool)
    fold = jax.jit(_fold_block)
    for got, want in zip(fold((m, l, acc), scores, none, v_blk), (m, l, acc)):
        assert np.array_equal(np.asarray(got), np.asarray(want))
    # an all-masked first block keeps the empty state: no NaN from exp(-inf - (-inf))
    empty = (jnp.full_like(m, -jnp.inf), jnp.zeros_like(l), jnp.zeros_like(acc))
    after = fold(empty, scores, none, v_blk)
    assert np.all(np.asarray(after[0]) == -np.inf)
    assert not np.any(np.asarray(after[1])) and not np.any(np.asarray(after[2]))
    # and a visible block after it is folded exactly like a first block
    some = jnp.asarray(rng.uniform(size=(r, 1, 1, t, bs)) < 0.5).at[..., 0].set(True)
    a, b = fold(after, scores, some, v_blk), fold(empty, scores, some, v_blk)
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
    assert np.all(np.isfinite(np.asarray(a[0]))) and np.all(np.asarray(a[1]) >= 1.0)


def test_sliding_window_hides_old_tokens():
    # a 3-token window at position 20: only positions 18..20 count, so changing token 5's KV changes nothing
    world = make_world(3, 4, 2, 8, 4, 1)
    pools = initial_pools(world, {0: 20})
    base, _ = step(blockwise, world, pools, [(0, 20)], None, window=3)
    b, o = divmod(world.slot(0, 5), world.block_size)
    poked = tuple(p.at[b, o].set(100.0) for p in pools)
    same, _ = step(blockwise, world, poked, [(0, 20)], None, window=3)
    seen, _ = step(blockwise, world, poked, [(0, 20)], None, window=0)
    unlimited, _ = step(blockwise, world, pools, [(0, 20)], None, window=0)
    assert np.array_equal(base, same) and not np.allclose(seen, unlimited)


@pytest.mark.slow
def test_bits_hold_at_a_serving_shape():
    # 16 decode rows beside a 96-token chunk, hq 12, hkv 2, dh 128, blocks of 16, contexts up to 1024
    world = make_world(11, 12, 2, 128, 16, 18, max_len=1024)
    target, chunk_seq = 16, 17
    dec_positions = np.random.default_rng(11).integers(0, 1024, 16).tolist()
    decode = list(enumerate(dec_positions))
    start, count, split = 700, 96, 37
    pools = initial_pools(world, {s: p for s, p in decode} | {target: 1000, chunk_seq: start})
    for window in (0, 300):
        alone, _ = step(blockwise, world, pools, [(target, 1000)], None, window)
        crowded, _ = step(
            blockwise, world, pools, decode[:5] + [(target, 1000)] + decode[5:], (chunk_seq, start, count), window
        )
        wide, _ = step(blockwise, world, pools, [(target, 1000)] + decode, None, window, width=128)
        assert np.array_equal(alone[0], crowded[5]) and np.array_equal(alone[0], wide[0])
        whole, pools_whole = step(blockwise, world, pools, decode, (chunk_seq, start, count), window)
        first, pools_after = step(blockwise, world, pools, [], (chunk_seq, start, split), window)
        second, _ = step(blockwise, world, pools_after, decode[:3], (chunk_seq, start + split, count - split), window)
        assert np.array_equal(whole[16:], np.concatenate([first, second[3:]]))
        redo, _ = step(blockwise, world, pools_whole, [(chunk_seq, start + count - 1)], None, window)
        assert np.array_equal(whole[-1], redo[0])
