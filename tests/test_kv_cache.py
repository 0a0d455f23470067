"""KVCache: one pool per KV state kind. A sliding-window kind keeps only the blocks its window still
reaches (dropped blocks go back to its pool, cached if full), every kind is freed on release, and a prefix
hit stops where every kind has what it needs."""

from __future__ import annotations

import math
import random

import pytest

from ember.runtime.state.block_pool import RESERVED_BLOCK, BlockPool
from ember.runtime.state.kinds import PagedKind, pool_blocks, window_pool_blocks
from ember.runtime.state.kv_cache import KVCache

BS = 4


def two_kinds(window: int, full_blocks: int = 64, window_blocks: int = 64) -> KVCache:
    return KVCache(
        {"kv": BlockPool(full_blocks, BS), "kv_window": BlockPool(window_blocks, BS, kind="kv_window")},
        {"kv_window": window},
    )


def held(kv: KVCache, state, kind: str) -> int:
    return sum(1 for b in state[kind].block_table if b != RESERVED_BLOCK)


def prefill_and_decode(kv: KVCache, tokens: list[int], chunk: int, on_step=None) -> dict:
    """Compute tokens in chunks of `chunk`, then one at a time, the way the scheduler drives a request."""
    state, done = kv.new_state(), 0
    while done < len(tokens):
        end = min(done + chunk, len(tokens)) if done < chunk * 3 else done + 1
        assert kv.grow(state, end)
        if on_step:
            on_step(state, done, end)
        done = end
        kv.commit(state, tokens, done)
    return state


@pytest.mark.parametrize("window", [1, 5, 8, 13])
def test_sliding_kind_holds_at_most_its_window_and_gives_blocks_back(window):
    kv = two_kinds(window)
    full, sliding = kv.pools["kv"], kv.pools["kv_window"]
    tokens = random.Random(window).choices(range(1, 50), k=120)
    chunk, peaks = 12, []

    def on_step(state, start, end):  # during a step: the window before `start` plus what the step writes
        peaks.append(held(kv, state, "kv_window"))
        assert held(kv, state, "kv_window") <= math.ceil(window / BS) + 1 + math.ceil((end - start) / BS)
        assert held(kv, state, "kv") == kv.blocks_for(end)  # the full kind keeps everything

    state = prefill_and_decode(kv, tokens, chunk, on_step)
    assert held(kv, state, "kv_window") <= math.ceil(window / BS) + 1  # between steps: the window only
    dropped = state["kv_window"].num_dropped
    assert dropped == (len(tokens) - window + 1) // BS and state["kv_window"].block_table[:dropped] == [0] * dropped
    assert sliding.used_blocks == held(kv, state, "kv_window") and full.used_blocks == kv.blocks_for(len(tokens))
    # dropped full blocks were committed first: they wait in the LRU, still findable
    assert sliding.cached_free_blocks == dropped
    kv.release(state)
    assert kv.all_free() and not state["kv"].block_table and not state["kv_window"].block_table
    kv.check_consistency()


def test_sizing_rule():
    kinds = (PagedKind("kv", 0), PagedKind("kv_window", 512))
    assert window_pool_blocks(512, 16, max_num_seqs=16, max_batched_tokens=512) == 16 * 33 + 32
    sizes = pool_blocks(kinds, 10_001, block_size=16, max_num_seqs=16, max_batched_tokens=512)
    assert sizes == {"kv": 10_001, "kv_window": 16 * 33 + 32 + 1}
    # never more than the full pool (a window longer than the pool's context is full attention)
    assert pool_blocks(kinds, 101, block_size=16, max_num_seqs=16, max_batched_tokens=512)["kv_window"] == 101


def test_prefix_hit_keeps_only_the_window_and_is_limited_to_where_every_kind_has_it():
    window = 8
    kv = two_kinds(window, window_blocks=20)
    sliding = kv.pools["kv_window"]
    prompt = random.Random(3).choices(range(1, 50), k=40)  # 10 full blocks
    kv.release(prefill_and_decode(kv, prompt, 8))
    # the sliding pool dropped blocks 0..7 early (LRU oldest first), then released 8 and 9 at the end
    hit = kv.find_prefix(prompt + [7])
    assert hit.num_blocks == 10  # the window before position 40 is blocks 8, 9: cached
    assert hit.blocks["kv_window"][:8] == (RESERVED_BLOCK,) * 8 and RESERVED_BLOCK not in hit.blocks["kv_window"][8:]
    assert RESERVED_BLOCK not in hit.blocks["kv"]

    sliding.allocate(4)  # evicts the 4 oldest cached sliding blocks: 0..3
    kv.check_consistency()
    shorter = prompt[:30] + [1, 2]  # full kind: 7 leading blocks cached
    hit = kv.find_prefix(shorter)
    assert hit.num_blocks == 7  # the window before position 28 (blocks 5, 6) is cached
    state = kv.new_state()
    assert kv.adopt(state, hit) == 28
    assert held(kv, state, "kv") == 7 and held(kv, state, "kv_window") == 2
    assert state["kv_window"].num_dropped == 5 and sliding.ref_count(state["kv_window"].block_table[6]) == 1
    kv.release(state)

    sliding.allocate(sliding.free_blocks)  # the sliding kind loses every cached block: no hit at all
    assert kv.find_prefix(shorter).num_blocks == 0 and kv.find_prefix(prompt + [7]).num_blocks == 0
    assert kv.pools["kv"].find_prefix(shorter) != []  # ... although the full kind alone would hit


def test_sliding_hit_needs_a_contiguous_run_covering_the_window():
    window = 10  # a query at p needs p - 9 on: from a block boundary, the 9 tokens before it span 3 blocks
    kv = two_kinds(window, window_blocks=40)
    sliding = kv.pools["kv_window"]
    prompt = random.Random(4).choices(range(1, 50), k=48)  # 12 blocks
    kv.release(prefill_and_decode(kv, prompt, 48))  # one chunk: every block released at the end, tail first
    hashes = kv.find_prefix(prompt + [1]).hashes
    # punch a hole at block 9: hits of 12, 11 and 10 blocks need it, a hit of 9 needs blocks 6, 7, 8 only
    hole = sliding.cached_block(hashes[9])
    sliding._cached_free.move_to_end(hole, last=False)  # make it the LRU victim
    plain_free = sliding.free_blocks - sliding.cached_free_blocks
    assert sliding.allocate(plain_free + 1)[-1] == hole
    assert kv.find_prefix(prompt + [1]).num_blocks == 9
    only_full = KVCache({"kv": kv.pools["kv"]})
    assert only_full.find_prefix(prompt + [1]).num_blocks == 12  # one kind: the plain prefix rule


def test_grow_is_all_or_nothing_across_kinds():
    kv = two_kinds(4, full_blocks=64, window_blocks=4)  # 3 usable sliding blocks
    state = kv.new_state()
    assert not kv.grow(state, 16)  # the full kind could, the sliding kind cannot: nothing taken
    assert held(kv, state, "kv") == 0 and kv.pools["kv"].used_blocks == 0
    assert kv.tokens_coverable(state) == 12 and kv.grow(state, 12)
    kv.commit(state, list(range(1, 13)), 12)  # positions >= 9 remain visible: blocks 0, 1 dropped
    assert held(kv, state, "kv_window") == 1 and kv.grow(state, 16)
    assert not kv.fits_alone(10**6) or kv.peak_blocks(kv.kinds[1], 10**6) == 2
    kv.release(state)
    assert kv.all_free()
