"""prefill_attention's algorithm on CPU: the jnp emulation of the kernel (same packing, tile ranges, KV
splits, masks and online softmax) against the reference `attention._attend`, and the tile-range arithmetic
the kernel shares with it, at sizes the emulation could never run (16k chunks, long prefixes).

The Triton kernel itself runs in test_prefill_interpret.py (CPU interpreter) and test_attention_prefill_gpu.py
(H200)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ember.compiler.kernels.attention.flops import useful_flops
from ember.compiler.kernels.attention.prefill import (
    PrefillAttentionConfig,
    chunk_info,
    launch_plan,
    prefill_attention_emulated,
    tile_ranges,
)
from ember.compiler.kernels.attention.reference import _attend


@dataclass(frozen=True)
class World:
    """The static side of a case (one compile each): heads, head_dim, page size, chunk bucket, tiles, dtype."""

    hq: int
    hkv: int
    dh: int
    page: int
    chunk: int
    block_m: int
    block_n: int
    splits: int | None
    dtype: str
    max_context: int = 160  # start + chunk never passes this

    @property
    def table_width(self) -> int:
        return self.max_context // self.page + 1


WORLDS = (  # GQA groups 1 / 4 / 6 / 8, dh 64 / 128, pages 16 / 32, tiles smaller and larger than a page
    World(hq=4, hkv=4, dh=64, page=16, chunk=32, block_m=16, block_n=16, splits=1, dtype="float32"),
    World(hq=8, hkv=2, dh=128, page=32, chunk=48, block_m=64, block_n=32, splits=2, dtype="bfloat16"),
    World(hq=12, hkv=2, dh=64, page=16, chunk=16, block_m=32, block_n=64, splits=3, dtype="float32"),
    World(hq=8, hkv=1, dh=128, page=16, chunk=32, block_m=128, block_n=16, splits=None, dtype="bfloat16"),
)


@functools.cache
def emulated(world: World):
    config = PrefillAttentionConfig(block_m=world.block_m, block_n=world.block_n, kv_splits=world.splits)
    return jax.jit(functools.partial(prefill_attention_emulated, scale=world.dh**-0.5, config=config))


@functools.cache
def reference(world: World):
    def run(q, k_pool, v_pool, table, positions, window):
        keys = k_pool[table].reshape(-1, world.hkv, world.dh).astype(jnp.float32)  # [W * page, hkv, dh]
        values = v_pool[table].reshape(-1, world.hkv, world.dh).astype(jnp.float32)
        return _attend(q.astype(jnp.float32)[None], keys[None], values[None], positions[None], window, world.dh**-0.5)[
            0
        ]

    return jax.jit(run)


def make_case(world: World, seed: int, num_tokens: int, start: int, window: int):
    """Garbage in every pool slot (block 0 and unwritten ones included: the mask must hide them), a shuffled
    table; a sliding window's table holds block 0 where the runtime handed blocks back."""
    rng = np.random.default_rng(seed)
    num_blocks = world.table_width + 2
    shape = (num_blocks, world.page, world.hkv, world.dh)
    k_pool = jnp.asarray(rng.standard_normal(shape) * 2, world.dtype)
    v_pool = jnp.asarray(rng.standard_normal(shape), world.dtype)
    table = rng.permutation(np.arange(1, num_blocks))[: world.table_width].astype(np.int32)
    if window > 0:
        table[: max(0, start - window + 1) // world.page] = 0
    q = jnp.asarray(rng.standard_normal((world.chunk, world.hq, world.dh)), world.dtype)
    positions = np.zeros(world.chunk, np.int32)  # padding rows: position 0, as runtime/execution/step_inputs.py
    positions[:num_tokens] = np.arange(start, start + num_tokens)
    return q, k_pool, v_pool, jnp.asarray(table), jnp.asarray(positions)


@st.composite
def cases(draw):
    world = draw(st.sampled_from(WORLDS))
    num_tokens = draw(st.integers(1, world.chunk))
    start = draw(st.one_of(st.just(0), st.integers(0, world.max_context - world.chunk)))
    window = draw(st.sampled_from([0, 0, 1, 7, 16, 33, 100]))
    return world, draw(st.integers(0, 2**31)), num_tokens, start, window


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
@example((WORLDS[0], 5, 32, 40, 10))  # the first tile's window starts at key 31: the last key of a KV tile
@example((WORLDS[2], 6, 16, 0, 0))  # a chunk from position 0, no prefix
def test_emulation_matches_reference(case) -> None:
    world, seed, num_tokens, start, window = case
    q, k_pool, v_pool, table, positions = make_case(world, seed, num_tokens, start, window)
    got = emulated(world)(q, k_pool, v_pool, table, positions, None, jnp.int32(window))  # valid rows from positions
    assert got.shape == q.shape and got.dtype == q.dtype
    got = np.asarray(got.astype(jnp.float32))
    assert np.isfinite(got).all()  # padding rows too
    expected = np.asarray(reference(world)(q, k_pool, v_pool, table, positions, jnp.int32(window)))
    tol = 2e-5 if world.dtype == "float32" else 1e-2  # bf16: P and the output are rounded to bf16
    np.testing.assert_allclose(got[:num_tokens], expected[:num_tokens], rtol=tol, atol=tol)


def test_explicit_num_tokens_agrees_and_empty_chunk_is_zero() -> None:
    world = WORLDS[0]
    q, k_pool, v_pool, table, positions = make_case(world, 3, 20, 50, 0)
    derived = emulated(world)(q, k_pool, v_pool, table, positions, None, jnp.int32(0))
    explicit = jax.jit(
        functools.partial(
            prefill_attention_emulated,
            scale=world.dh**-0.5,
            config=PrefillAttentionConfig(block_m=16, block_n=16, kv_splits=1),
        )
    )
    np.testing.assert_array_equal(
        np.asarray(derived[:20]), np.asarray(explicit(q, k_pool, v_pool, table, positions, jnp.int32(20), 0)[:20])
    )
    assert not np.asarray(explicit(q, k_pool, v_pool, table, positions, jnp.int32(0), 0)).any()


def test_chunk_info_derives_valid_rows_from_positions() -> None:
    assert chunk_info(np.array([7, 8, 9, 0, 0], np.int32), None, 4).tolist() == [7, 3, 4]
    assert chunk_info(np.array([0, 1, 2, 0], np.int32), None, 0).tolist() == [0, 3, 0]
    assert chunk_info(np.array([5, 6, 7, 8], np.int32), None, 0).tolist() == [5, 4, 0]
    assert chunk_info(np.zeros(4, np.int32), None, 0).tolist() == [0, 1, 0]  # an all-padding chunk
    assert chunk_info(np.array([5, 6, 0], np.int32), 2, 9).tolist() == [5, 2, 9]
    # the loader hands per-layer constants over in the activation dtype: the window becomes int32 before any math
    assert chunk_info(np.array([1000, 1001], np.int32), None, jnp.bfloat16(512)).tolist() == [1000, 2, 512]


def test_launch_plan_shapes() -> None:
    config = PrefillAttentionConfig(block_m=128, block_n=64)
    big = launch_plan(4096, 32, 8, 128, 16, 1024, scale=0.1, config=config)
    assert big.grid == (4096 * 4 // 128, 8, 1)  # enough programs: no KV split
    small = launch_plan(16, 12, 2, 128, 16, 1024, scale=0.1, config=config)
    assert small.block_m == 128 and small.grid[:2] == (1, 2) and small.splits == 16  # 96 rows, long table
    short_table = launch_plan(16, 12, 2, 128, 16, 8, scale=0.1, config=config)
    assert short_table.splits == 1  # 2 KV tiles at most: nothing to split
    tiny = launch_plan(16, 4, 4, 64, 16, 8, scale=0.1, config=config)
    assert tiny.block_m == 16  # no more rows than the chunk packs
    with pytest.raises(ValueError):
        launch_plan(16, 12, 5, 128, 16, 8, scale=0.1, config=config)
    with pytest.raises(ValueError):
        launch_plan(16, 12, 2, 96, 16, 8, scale=0.1, config=config)


@settings(max_examples=150, deadline=None)
@given(
    chunk=st.sampled_from([16, 64, 256, 512, 1024, 2048, 4096, 16384]),
    data=st.data(),
    group=st.sampled_from([1, 4, 6, 8]),
    block_m=st.sampled_from([16, 32, 64, 128]),
    block_n=st.sampled_from([16, 32, 64, 128]),
    splits=st.integers(1, 5),
    window=st.sampled_from([0, 1, 100, 512, 4096]),
)
def test_tile_ranges_cover_every_visible_key_and_skip_masks_only_where_safe(
    chunk, data, group, block_m, block_n, splits, window
) -> None:
    """Per program (tile of packed rows): the splits' tile ranges are disjoint, in order, cover every key some
    row sees and nothing past the tile's last query; an unmasked tile is seen whole by every row (padding
    rows act as the last valid token); at most two masked tiles per split on each ragged end."""
    num_tokens = data.draw(st.integers(0, chunk))
    start = data.draw(st.integers(0, 20000))
    m_tiles = -(-chunk * group // block_m)
    for pid_m in sorted({0, m_tiles - 1, data.draw(st.integers(0, m_tiles - 1))}):
        first, last = pid_m * block_m, min(pid_m * block_m + block_m, num_tokens * group) - 1
        visited = []
        for split in range(splits):
            s_begin, mid_begin, mid_end, s_end = tile_ranges(
                pid_m, split, start, num_tokens, window, block_m=block_m, block_n=block_n, group=group, splits=splits
            )
            assert s_begin <= mid_begin <= mid_end <= s_end
            visited += range(s_begin, s_end)
            if first > last:  # a tile of padding rows reads nothing
                assert s_begin == s_end
                continue
            q_lo, q_hi = start + first // group, start + last // group
            for j in range(mid_begin, mid_end):  # every row sees all of keys [j * bn, (j + 1) * bn)
                assert (j + 1) * block_n - 1 <= q_lo
                assert window <= 0 or j * block_n > q_hi - window
        assert visited == sorted(set(visited))  # disjoint, in order
        if first > last:
            continue
        q_lo, q_hi = start + first // group, start + last // group
        needed_lo = max(0, q_lo - window + 1) if window > 0 else 0
        assert visited[0] * block_n <= needed_lo and visited[-1] * block_n <= q_hi < (visited[-1] + 1) * block_n
        assert len(visited) == visited[-1] - visited[0] + 1  # contiguous: every key in between is covered
        assert visited[0] == needed_lo // block_n  # nothing before the earliest visible key


def test_useful_flops_counts_the_causal_triangle_and_window() -> None:
    assert useful_flops(3, 0, 0, 1, 1) == 4 * (1 + 2 + 3)
    assert useful_flops(2, 10, 0, 2, 8) == 4 * (11 + 12) * 2 * 8
    assert useful_flops(3, 10, 4, 1, 1) == 4 * 12
