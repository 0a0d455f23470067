"""The prefix cache's host tier (runtime/state/host_tier.py) under a KVCache and the Scheduler, over a simulated
device (numpy): blocks evicted from the device cache come back byte for byte on a later prefix hit, a step's copies
are one gather and one scatter, the host pool stays within its bytes, a restore whose request went away before the
step leaks nothing, and a soak of aborts and preemptions gives every request what it gets alone; and the JAX
copier (runtime/execution/block_copies.py) moves the paged layers' blocks exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scheduler_support import soak
from test_scheduler import STOP, MockPlan, check_invariants, generate_alone, prompt_of

from ember.runtime.scheduling.requests import Request
from ember.runtime.scheduling.scheduled_step import PrefillShapes
from ember.runtime.scheduling.scheduler import Scheduler
from ember.runtime.state.block_pool import BlockPool, block_hash
from ember.runtime.state.host_tier import BLOCKS, HostEntry, HostTier, _Piece
from ember.runtime.state.kv_cache import HOST_BLOCK, KVCache

BS = 4  # tokens per block


class NumpyCopier:
    """The BlockCopier over a numpy "device": kv [num_blocks, BS] of one layer's values, as [n, 1, 1, BS] blocks
    in pieces of at most 3. Counts its calls (one gather and one scatter per dispatch at most) and the pieces
    each scatter reads (a restore moves whole pieces)."""

    def __init__(self):
        self.gathers = self.scatters = 0
        self.pieces_read: list[int] = []

    def gather(self, kv, blocks):
        self.gathers += 1
        rows = kv[np.asarray(blocks, np.int64)][:, None, None]
        return [rows[i : i + 3].copy() for i in range(0, len(blocks), 3)]

    def scatter(self, kv, blocks, entries):
        self.scatters += 1
        self.pieces_read.append(len({id(entry.piece) for entry in entries}))
        for block, entry in zip(blocks, entries):
            kv[block] = entry.data()[0, 0]
        return kv

    def take_rows(self, array, rows):
        return array[np.asarray(rows)].copy()


def host_entry(values) -> HostEntry:
    """A host entry of one block holding these token values (as a gather would leave it)."""
    return HostEntry(_Piece(np.asarray(values, np.int64)[None, None, None]), 0)


def make_cache(num_blocks=8, host_blocks=64):
    tier = HostTier(host_blocks * BS * 8, BS * 8, BS)  # int64 token values: BS * 8 bytes a block
    return KVCache({"kv": BlockPool(num_blocks, BS)}, host_tier=tier), tier


def chain(tokens) -> list[bytes]:
    hashes, parent = [], None
    for i in range(len(tokens) // BS):
        parent = block_hash(parent, tokens[i * BS : (i + 1) * BS])
        hashes.append(parent)
    return hashes


def serve(kv: KVCache, device: np.ndarray, copier: NumpyCopier, tokens) -> int:
    """Admit (prefix hit), dispatch the step's copies, check the reused blocks hold the prompt, "compute" the rest,
    commit, release: the tokens the hit covered."""
    state = kv.new_state()
    covered = kv.adopt(state, kv.find_prefix(tokens))
    assert kv.grow(state, len(tokens))
    kv.host_tier.dispatch(device, copier)
    table = state["kv"].block_table
    for i in range(covered // BS):
        assert device[table[i]].tolist() == tokens[i * BS : (i + 1) * BS], f"block {i} came back wrong"
    for i in range(covered // BS, len(table)):
        device[table[i]] = -1
        part = tokens[i * BS : (i + 1) * BS]
        device[table[i], : len(part)] = part
    kv.commit(state, tokens, len(tokens))
    kv.release(state)
    kv.check_consistency()
    return covered


def test_evicted_prefixes_come_back_from_the_host_byte_for_byte():
    kv, tier = make_cache()
    device, copier = np.full((8, BS), -1, np.int64), NumpyCopier()
    prompts = [prompt_of(4 * BS + 1, seed) for seed in range(4)]  # 4 full blocks each; the pool holds 7
    for p in prompts:
        assert serve(kv, device, copier, p) == 0
    assert tier.counters().offloaded_blocks == kv.primary.counters().evictions > 0
    for p in prompts:  # each comes back whole, its evicted blocks from the host
        assert serve(kv, device, copier, p) == 4 * BS
    counters = tier.counters()
    assert counters.restored_blocks >= 8 and counters.restored_tokens == counters.restored_blocks * BS
    steps = 8
    assert copier.gathers <= steps and copier.scatters <= steps  # batched: one of each per dispatch at most


def test_a_hit_continues_from_device_blocks_into_host_blocks_within_the_free_room():
    kv, tier = make_cache(num_blocks=8)
    device, copier = np.full((8, BS), -1, np.int64), NumpyCopier()
    base = prompt_of(6 * BS + 1, 1)
    serve(kv, device, copier, base)  # 6 blocks cached, then pushed out tail first
    serve(kv, device, copier, prompt_of(3 * BS + 1, 2))
    hit = kv.find_prefix(base)
    blocks = hit.blocks["kv"]
    assert hit.num_blocks == 6 and HOST_BLOCK in blocks and blocks[0] != HOST_BLOCK  # head on device, tail host
    # a request holding most of the pool leaves room for fewer restores: the hit stops where the room ends
    holder = kv.new_state()
    assert kv.grow(holder, 5 * BS)
    short = kv.find_prefix(base)
    assert short.num_blocks < 6 and kv.tokens_coverable_after(short) > short.num_blocks * BS  # a block to go on
    kv.release(holder)
    kv.host_tier.dispatch(device, copier)
    assert serve(kv, device, copier, base) == 6 * BS


def test_a_spill_not_dispatched_yet_is_not_found_and_capacity_holds():
    kv, tier = make_cache(num_blocks=6, host_blocks=3)
    device, copier = np.full((6, BS), -1, np.int64), NumpyCopier()
    first = prompt_of(4 * BS + 1, 1)
    serve(kv, device, copier, first)
    state = kv.new_state()
    kv.adopt(state, kv.find_prefix(prompt_of(4 * BS + 1, 2)))
    assert kv.grow(state, 4 * BS + 1)  # evicts `first`'s blocks: queued, not yet copied
    assert kv.find_prefix(first).num_blocks == 0 and tier.has_pending
    kv.host_tier.dispatch(device, copier)
    assert kv.find_prefix(first).num_blocks == 0  # on the host, but no device block is free to restore into
    kv.release(state)
    # the pool evicts a chain's tail first, so the 3 most recent spills the host keeps are its head
    assert kv.find_prefix(first).num_blocks == 3 == len(tier)
    counters = tier.counters()  # of the 4 spills of one step, the oldest was never copied: it would drop at once
    assert tier.used_bytes == tier.capacity_bytes and counters.offloaded_blocks == 3 and counters.dropped_blocks == 0
    kv.check_consistency()


def test_a_restore_whose_request_left_before_the_step_is_spilled_from_its_host_bytes():
    kv, tier = make_cache(num_blocks=6)
    device, copier = np.full((6, BS), -1, np.int64), NumpyCopier()
    prompt = prompt_of(4 * BS + 1, 1)
    serve(kv, device, copier, prompt)
    serve(kv, device, copier, prompt_of(4 * BS + 1, 2))  # `prompt` now lives on the host
    state = kv.new_state()
    assert kv.adopt(state, kv.find_prefix(prompt)) == 4 * BS  # restores queued
    kv.release(state)  # aborted before its step: the restored blocks are cached free, their bytes not written
    other = kv.new_state()
    assert kv.grow(other, 5 * BS)  # takes every block: evicts the restored ones before their copy ran
    kv.host_tier.dispatch(device, copier)
    assert copier.scatters == 0  # nothing was written into a block that changed owner
    kv.release(other)
    assert serve(kv, device, copier, prompt) == 4 * BS  # and the bytes came back from the host all the same
    assert kv.all_free() and not tier.has_pending


def test_a_hit_takes_its_host_entries_before_its_allocation_can_drop_them():
    """The allocation of a hit's restores may evict a block whose own restore never ran, whose bytes then go back
    into the full host LRU and drop its oldest entry: the hit's own entries were taken out first."""
    kv, tier = make_cache(num_blocks=5, host_blocks=2)
    device, copier = np.full((5, BS), -1, np.int64), NumpyCopier()
    prompt = prompt_of(2 * BS + 1, 1)
    hashes = chain(prompt)
    for i, h in enumerate(hashes):  # the prompt's two blocks on the host, its head the oldest entry
        tier._put((BLOCKS, h), host_entry(prompt[i * BS : (i + 1) * BS]))
    other = prompt_of(BS, 2)
    (pending,) = kv.primary.allocate_registered(chain(other))  # a restore queued, its request already gone
    tier.restore(pending, host_entry(other))
    kv.primary.free([pending])
    (newer,) = kv.primary.allocate_registered(chain(prompt_of(BS, 3)))
    kv.primary.free([newer])  # cached free after `pending`: the LRU evicts `pending` first
    holder = kv.new_state()
    assert kv.grow(holder, 2 * BS)  # the rest of the pool: room for one restore and the chunk after it
    hit = kv.find_prefix(prompt)
    assert hit.num_blocks == 1 and hit.blocks["kv"] == (HOST_BLOCK,)
    state = kv.new_state()
    assert kv.adopt(state, hit) == BS  # evicts `pending`: its bytes go back to the host, dropping nothing taken
    kv.host_tier.dispatch(device, copier)
    assert device[state["kv"].block_table[0]].tolist() == prompt[:BS]
    assert chain(other)[0] in tier and hashes[1] in tier and len(tier) == 2
    kv.release(state)
    kv.release(holder)
    kv.check_consistency()


def test_soak_with_a_small_host_tier_aborts_and_preemptions():
    """test_scheduler's soak over a pool too small for its prompts and a host tier smaller still: MockPlan reads
    every context back through the block tables, so a restore that wrote the wrong bytes changes the output."""
    rng = random.Random(99)
    tier = HostTier(24 * BS * 8, BS * 8, BS)
    kv = KVCache({"kv": BlockPool(28, BS)}, host_tier=tier)
    s = Scheduler(kv, 6, 24, 12, (8, 16), prefill_shapes=PrefillShapes((8, 16), (1, 2), 8))
    mock, copier = MockPlan(s), NumpyCopier()
    run = mock.run

    def run_with_copies(plan):  # the executor's launch: the tier's copies before the forward
        shadow = mock.shadow["kv"].reshape(-1, BS)
        tier.dispatch(shadow, copier)
        return run(plan)

    mock.run = run_with_copies
    bases = [prompt_of(rng.randint(12, 30), 100 + i) for i in range(5)]
    pending = []
    for i in range(300):
        prompt = (rng.choice(bases) if rng.random() < 0.7 else []) + prompt_of(rng.randint(1, 30), 1000 + i)
        pending.append(Request(f"q{i}", prompt, rng.randint(1, 16), frozenset({STOP})))
    specs = {r.request_id: (list(r.prompt_token_ids), r.max_tokens) for r in pending}
    res = soak(s, mock, pending, rng, check_invariants, max_steps=20_000)
    for rid, (prompt, max_tokens) in specs.items():
        expected = generate_alone(prompt, max_tokens)
        assert res.streamed[rid] == (expected if rid in res.finished else expected[: len(res.streamed[rid])]), rid
    counters = tier.counters()
    assert s.kv.all_free() and not tier.has_pending and len(tier) <= tier.capacity_blocks
    assert counters.restored_blocks > 20 and counters.dropped_blocks > 0, counters
    assert s.snapshot().preemptions > 5 and len(res.aborted) > 5


@pytest.mark.parametrize("count", [1, 3, 5])
@pytest.mark.parametrize("piece", [64, 2])  # 2: a restore of 5 goes as pieces of 2, 2 and 1 blocks
def test_the_jax_copier_moves_every_paged_layer_exactly(count, piece, monkeypatch):
    import jax.numpy as jnp

    from ember.runtime.execution import block_copies
    from ember.runtime.execution.block_copies import BlockCopier

    monkeypatch.setattr(block_copies, "PIECE", piece)

    rng = np.random.default_rng(count)
    shape = (6, BS, 2, 8)  # [num_blocks, bs, hkv, dh]
    values = [tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(2)) for _ in range(2)]
    kv = [tuple(jnp.asarray(a) for a in layer) for layer in values] + [()]  # a stateless layer is left alone
    copier = BlockCopier(layers=(0, 1))
    blocks = [5, 2, 3, 0, 4][:count]
    pieces = [_Piece(a) for a in copier.gather(kv, blocks)]
    assert [p.rows for p in pieces] == block_copies._pieces(count)
    assert all(p.array.sharding.memory_kind == "pinned_host" for p in pieces)
    host = np.concatenate([p.host() for p in pieces])
    assert host.shape == (count, 2, 2, BS, 2, 8)
    for layer in range(2):
        for part in range(2):
            np.testing.assert_array_equal(host[:, layer, part], values[layer][part][blocks])
    targets = [1, 4, 2, 3, 5][:count]
    entries = [HostEntry(p, i) for p in pieces for i in range(p.rows)]
    # 5: four of them, out of gather order (a piece's row that is not restored is written nowhere)
    order = [2, 3, 4, 0] if count == 5 else list(range(count))
    moved = copier.scatter(kv, [targets[i] for i in order], [entries[i] for i in order])
    assert moved[2] == ()
    for layer in range(2):
        for part in range(2):
            want = values[layer][part].copy()
            want[[targets[i] for i in order]] = values[layer][part][[blocks[i] for i in order]]
            np.testing.assert_array_equal(np.asarray(moved[layer][part]), want)


def test_a_restore_crosses_in_few_transfers():
    from ember.runtime.execution.block_copies import PIECE, _pieces

    assert _pieces(1_000) == [PIECE] * 15 + [32, 8]  # a 16k-token prompt: 17 transfers, not 1,000
    assert _pieces(13) == [8, 4, 1] and _pieces(PIECE) == [PIECE] and _pieces(0) == []


def test_precompiled_copies_do_not_compile_when_a_step_needs_them(caplog):
    import logging

    import jax
    import jax.numpy as jnp

    from ember.runtime.execution.block_copies import BlockCopier

    # committed to the device, as a step leaves them
    kv = jax.device_put([(jnp.zeros((8, BS, 1, 8)), jnp.ones((8, BS, 1, 8))) for _ in range(2)], jax.devices()[0])
    copier = BlockCopier(layers=(0, 1))
    copier.precompile(kv, max_blocks=3)  # a copy of 3 goes as pieces of 2 + 1
    with jax.log_compiles(True), caplog.at_level(logging.DEBUG, logger="jax"):
        pieces = [_Piece(a) for a in copier.gather(kv, [1, 2, 3])]
        entries = [HostEntry(p, i) for p in pieces for i in range(p.rows)]
        kv = copier.scatter(kv, [4, 5, 6], [entries[i] for i in (2, 0, 1)])  # the pieces of 1 and 2
    copies = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage() and "_gather" in r.getMessage()]
    copies += [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage() and "_scatter" in r.getMessage()]
    assert not copies, copies
    with jax.log_compiles(True), caplog.at_level(logging.DEBUG, logger="jax"):
        copier.gather(kv, list(range(4)))  # a piece of 4: a shape precompile did not cover, so the log shows it
    assert any("Compiling" in r.getMessage() and "_gather" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(np.asarray(kv[1][1])[[4, 5, 6]], np.ones((3, BS, 1, 8)))


def test_a_chain_spilled_together_comes_back_as_its_pieces_and_thinned_pieces_are_compacted():
    """Blocks evicted tail first are gathered head first, so the hit that restores the chain reads the pieces it
    went out as, each once; a piece that lost most of its entries is copied down to its survivors at the next
    dispatch, so it does not hold the memory of the dropped ones."""
    kv, tier = make_cache(num_blocks=8)
    device, copier = np.full((8, BS), -1, np.int64), NumpyCopier()
    prompt = prompt_of(6 * BS + 1, 1)
    serve(kv, device, copier, prompt)
    serve(kv, device, copier, prompt_of(6 * BS + 1, 2))  # evicts the first prompt's 6 blocks, tail first
    pieces = {id(tier._entries[BLOCKS, h].piece) for h in chain(prompt) if h in tier}
    assert len(pieces) == 2  # 6 blocks in pieces of 3
    assert serve(kv, device, copier, prompt) == 6 * BS
    assert copier.pieces_read[-1] == 2  # the restore moved the two pieces of the chain
    # thin a gather piece to one of its three entries: the next dispatch copies that one out
    survivors = [h for h in chain(prompt_of(6 * BS + 1, 2)) if h in tier]
    piece = tier._entries[BLOCKS, survivors[0]].piece
    keys = sorted(piece.keys, key=lambda k: tier._entries[k].index)
    tier.take([h for _, h in keys[1:]])
    tier.dispatch(device, copier)
    moved = tier._entries[keys[0]]
    assert moved.piece is not piece and moved.piece.rows == 1 and not piece.keys
    assert moved.data().tolist() == piece.host()[0].tolist()
    tier.check_consistency()
