"""BlockPool: ref-counted allocation, the hash-chained prefix cache, LRU eviction, state kinds."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.runtime.loading.plans import GENERATED_DIR as GENERATED
from ember.runtime.state.block_pool import BlockPool, KVAllocation, NoFreeBlocksError, block_hash
from ember.runtime.state.kinds import StateKind, allocators_for, state_kinds
from ember.runtime.state.slot_pool import SlotPool


def computed_allocation(pool: BlockPool, tokens: list[int]) -> KVAllocation:
    """An allocation whose KV for all `tokens` is computed and committed (what a finished prefill leaves)."""
    alloc = pool.new_allocation()
    assert pool.grow(alloc, len(tokens))
    pool.commit_full_blocks(alloc, tokens, len(tokens))
    return alloc


def test_allocate_never_hands_out_block_zero_and_counts_refs():
    pool = BlockPool(num_blocks=9, block_size=4)
    assert pool.num_usable_blocks == 8 and pool.free_blocks == 8
    blocks = pool.allocate(8)
    assert sorted(blocks) == list(range(1, 9))
    assert pool.free_blocks == 0 and all(pool.ref_count(b) == 1 for b in blocks)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    pool.free(blocks[:3])
    assert pool.free_blocks == 3
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free(blocks[:1])
    pool.free(blocks[3:])
    assert pool.free_blocks == 8 and pool.counters().allocations == 8
    pool.check_consistency()


def test_block_hash_is_stable_and_chained():
    # pinned: the hash must not change between processes or releases (persisted caches would break)
    assert block_hash(None, [1, 2, 3, 4]).hex() == block_hash(None, (1, 2, 3, 4)).hex()
    assert block_hash(None, [1, 2, 3, 4]).hex() == "c17067cdd84fbeca90e86e08b3a62399"
    spelled_out = hashlib.blake2b(b"R" + struct.pack("<4q", 1, 2, 3, 4), digest_size=16, person=b"ember-kv-block")
    assert block_hash(None, [1, 2, 3, 4]) == spelled_out.digest()
    root = block_hash(None, [1, 2, 3, 4])
    assert block_hash(root, [5, 6, 7, 8]) != block_hash(None, [5, 6, 7, 8])  # same block, other prefix
    assert block_hash(None, [1, 2, 3, 5]) != root
    assert block_hash(None, [256]) != block_hash(None, [1, 0])  # ids are not byte-packed ambiguously


def test_match_prefix_shares_full_leading_blocks_and_never_the_whole_prompt():
    pool = BlockPool(num_blocks=16, block_size=4)
    tokens = list(range(100, 112))  # exactly 3 full blocks
    owner = computed_allocation(pool, tokens)
    assert all(pool.hash_of(b) is not None for b in owner.block_table)
    # the same 12 tokens: only 2 blocks, so the last token is still computed and gives logits
    assert pool.match_prefix(tokens) == owner.block_table[:2]
    assert [pool.ref_count(b) for b in owner.block_table] == [2, 2, 1]
    # a longer prompt gets all 3; a prompt differing inside block 2 gets only block 1
    assert pool.match_prefix(tokens + [7]) == owner.block_table
    assert pool.match_prefix(tokens[:5] + [0] + tokens[6:] + [7]) == owner.block_table[:1]
    assert pool.match_prefix([9] + tokens) == []
    c = pool.counters()
    assert (c.prefix_queries, c.prefix_hits, c.reused_tokens) == (4, 3, 8 + 12 + 4)
    # find_prefix has no side effects
    before = [pool.ref_count(b) for b in owner.block_table]
    assert pool.find_prefix(tokens + [7]) == owner.block_table
    assert [pool.ref_count(b) for b in owner.block_table] == before and pool.counters() == c
    pool.check_consistency()


def test_partial_and_uncomputed_blocks_are_never_registered():
    pool = BlockPool(num_blocks=16, block_size=4)
    alloc = pool.new_allocation()
    tokens = list(range(10))
    assert pool.grow(alloc, 10) and len(alloc.block_table) == 3
    assert pool.commit_full_blocks(alloc, tokens, 7) == 1  # block 2 is not computed to its end yet
    assert pool.hash_of(alloc.block_table[1]) is None and pool.hash_of(alloc.block_table[2]) is None
    assert pool.commit_full_blocks(alloc, tokens, 10) == 1  # block 3 holds 2 of 4 tokens: stays private
    assert pool.hash_of(alloc.block_table[2]) is None
    assert pool.find_prefix(tokens + [0, 0, 0]) == alloc.block_table[:2]


def test_released_blocks_stay_cached_until_evicted_lru_tail_first():
    pool = BlockPool(num_blocks=7, block_size=2)  # 6 usable
    old = computed_allocation(pool, [1, 2, 3, 4])  # 2 blocks
    new = computed_allocation(pool, [5, 6, 7, 8])  # 2 blocks
    old_blocks, new_blocks = list(old.block_table), list(new.block_table)
    pool.release(old)
    pool.release(new)
    assert pool.free_blocks == 6 and pool.cached_free_blocks == 4
    # a hit revives cached-free blocks: they leave the free count
    hit = pool.new_allocation()
    assert pool.adopt_prefix(hit, [5, 6, 7, 8, 9]) == 4 and hit.block_table == new_blocks
    assert pool.free_blocks == 4 and hit.block_hashes == [pool.hash_of(b) for b in new_blocks]
    pool.release(hit)  # new chain is now the most recently used
    # 2 plain free blocks first, then evictions: the old chain, its tail before its head
    fresh = pool.allocate(3)
    assert fresh[2] == old_blocks[1] and pool.counters().evictions == 1
    assert pool.find_prefix([1, 2, 3, 4, 0]) == old_blocks[:1]  # head survived
    fresh += pool.allocate(1)
    assert pool.find_prefix([1, 2, 3, 4, 0]) == [] and pool.counters().evictions == 2
    assert pool.find_prefix([5, 6, 7, 8, 0]) == new_blocks
    pool.free(fresh)
    pool.check_consistency()
    assert pool.free_blocks == 6


def test_duplicate_content_stays_private():
    pool = BlockPool(num_blocks=9, block_size=2)
    first = computed_allocation(pool, [1, 2, 3, 4])
    second = computed_allocation(pool, [1, 2, 3, 4])  # prefilled side by side, no hit
    assert second.block_hashes == first.block_hashes
    assert all(pool.hash_of(b) is None for b in second.block_table)
    pool.release(second)
    assert pool.cached_free_blocks == 0 and pool.free_blocks == 6
    pool.release(first)
    assert pool.cached_free_blocks == 2
    pool.check_consistency()


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_prefix_cache_only_ever_returns_blocks_holding_the_same_prefix(data):
    """Random admissions / partial commits / releases on a small pool (so evictions happen): every block a
    match returns holds exactly the tokens of the asked prefix, and nothing leaks."""
    pool = BlockPool(num_blocks=data.draw(st.integers(3, 12)), block_size=2)
    content: dict[int, tuple[int, ...]] = {}  # registered block -> the whole token prefix up to its end
    live = []
    for _ in range(data.draw(st.integers(1, 30))):
        if live and data.draw(st.booleans()):
            pool.release(live.pop(data.draw(st.integers(0, len(live) - 1))))
            continue
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=9))  # tiny alphabet: shared prefixes
        alloc = pool.new_allocation()
        cached = pool.adopt_prefix(alloc, tokens)
        assert cached <= len(tokens) - 1
        for i, block in enumerate(alloc.block_table):
            assert content[block] == tuple(tokens[: (i + 1) * 2])
        if not pool.grow(alloc, len(tokens)):
            pool.release(alloc)
            continue
        computed = data.draw(st.integers(cached, len(tokens)))
        pool.commit_full_blocks(alloc, tokens, computed)
        for i, block in enumerate(alloc.block_table[: computed // 2]):
            if pool.hash_of(block) == alloc.block_hashes[i]:
                content[block] = tuple(tokens[: (i + 1) * 2])
        live.append(alloc)
        pool.check_consistency()
    for alloc in live:
        pool.release(alloc)
    pool.check_consistency()
    assert pool.free_blocks == pool.num_usable_blocks


def test_grow_is_all_or_nothing():
    pool = BlockPool(num_blocks=5, block_size=4)
    alloc = pool.new_allocation()
    assert pool.grow(alloc, 9) and len(alloc.block_table) == 3
    assert pool.grow(alloc, 12) and len(alloc.block_table) == 3  # still covered
    assert pool.tokens_coverable(alloc) == 16
    assert not pool.grow(alloc, 17) and len(alloc.block_table) == 3 and pool.free_blocks == 1
    assert pool.grow(alloc, 16) and pool.free_blocks == 0


def test_bad_pool_shapes_are_refused():
    with pytest.raises(ValueError, match="reserved"):
        BlockPool(num_blocks=1)
    with pytest.raises(ValueError, match="block_size"):
        BlockPool(num_blocks=4, block_size=0)


@pytest.mark.parametrize("arch", sorted(p.name for p in (GENERATED / "cpu").iterdir() if p.is_dir()))
def test_state_kinds_of_generated_plans(arch):
    manifest = json.loads((GENERATED / "cpu" / arch / "manifest.json").read_text())
    kinds = state_kinds(manifest)
    # one paged kind per attention kind: full attention, plus the sliding window where layers have one; the
    # recurrent slot kind where layers run Gated DeltaNet
    recurrent = arch in ("qwen3_next", "qwen3_5", "qwen3_5_moe")
    want = ["kv", "kv_window"] if arch == "gemma3" else ["kv", "recurrent"] if recurrent else ["kv"]
    assert [k.name for k in kinds] == want
    assert [k.paged for k in kinds] == [name != "recurrent" for name in want]
    assert set(manifest["layer_state"].values()) == {k.name for k in kinds}
    allocators = allocators_for(kinds, num_blocks=8, block_size=16, num_slots=3)
    assert isinstance(allocators["kv"], BlockPool) and allocators["kv"].block_size == 16
    if recurrent:
        assert isinstance(allocators["recurrent"], SlotPool) and allocators["recurrent"].num_slots == 3
        arrays = manifest["state"]["recurrent"]["arrays"]
        assert {n: a["dtype"] for n, a in arrays.items()} == {"conv": "float32", "delta": "float32"}


def test_state_kinds_for_recurrent_and_unknown_state():
    kinds = state_kinds({"state": {"kv": {}, "ssm": {"layout": "slot", "shape": [4, 8]}}})
    assert kinds[1] == StateKind("ssm", False, {"layout": "slot", "shape": [4, 8]})
    assert isinstance(allocators_for(kinds, num_blocks=8, block_size=16)["ssm"], SlotPool)
    with pytest.raises(ValueError, match="conv"):
        state_kinds({"state": {"kv": {}, "conv": {}}})
    with pytest.raises(ValueError, match="no 'state'"):
        state_kinds({})
    with pytest.raises(ValueError, match="no 'kv'"):
        allocators_for((), num_blocks=8, block_size=16)
    with pytest.raises(ValueError, match="no 'kv'"):
        allocators_for(kinds[1:], num_blocks=8, block_size=16)
