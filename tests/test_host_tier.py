"""The prefix cache's host tier (runtime/state/host_tier.py) over a simulated small device pool: blocks evicted
from the device cache come back from the host byte for byte on a later prefix hit, the host pool stays within
its capacity, counters add up, and requests aborted while their copies are in flight leak nothing."""

from __future__ import annotations

import numpy as np
import pytest

from ember.runtime.state.block_pool import block_hash
from ember.runtime.state.host_tier import HostTier, TieredBlockPool, data_bytes

BS = 4  # tokens per block
BLOCK_SHAPE = (2, BS, 8)  # K and V of one block: [2, tokens, head dim]
BLOCK_BYTES = int(np.prod(BLOCK_SHAPE)) * 4


class ManualCopy:
    """An asynchronous copy that runs when waited for (result) unless cancelled first."""

    def __init__(self, fn):
        self.fn, self.done, self.cancelled, self.value = fn, False, False, None

    def result(self):
        assert not self.cancelled, "waited for a cancelled copy"
        if not self.done:
            self.value, self.done = self.fn(), True
        return self.value

    def cancel(self) -> bool:
        if self.done:
            return False
        self.cancelled = True
        return True


class SimulatedDevice:
    """The KV arrays of a small pool, [blocks, 2, BS, 8] float32. A read captures the block when issued (as a
    device copy is ordered before later writes) and reaches the host when waited for; a write lands when
    waited for (before the step that reads the block)."""

    def __init__(self, num_blocks: int):
        self.kv = np.full((num_blocks, *BLOCK_SHAPE), np.nan, np.float32)
        self.copies: list[ManualCopy] = []

    def read(self, block: int) -> ManualCopy:
        staged = self.kv[block].copy()
        self.copies.append(ManualCopy(lambda: staged.copy()))
        return self.copies[-1]

    def write(self, block: int, data) -> ManualCopy:
        def land():
            self.kv[block] = data

        self.copies.append(ManualCopy(land))
        return self.copies[-1]


def kv_of(chain_hash: bytes) -> np.ndarray:
    """The KV a block with this prefix holds (a function of the whole prefix, as real KV is)."""
    return np.random.default_rng(int.from_bytes(chain_hash[:8], "little")).standard_normal(BLOCK_SHAPE, np.float32)


def chain(tokens) -> list[bytes]:
    hashes, parent = [], None
    for i in range(len(tokens) // BS):
        parent = block_hash(parent, tokens[i * BS : (i + 1) * BS])
        hashes.append(parent)
    return hashes


def make_pool(num_blocks=6, host_blocks=64):
    device = SimulatedDevice(num_blocks)
    return TieredBlockPool(num_blocks, BS, device, HostTier(host_blocks * BLOCK_BYTES, BLOCK_BYTES)), device


def serve(pool, device, tokens) -> tuple[int, object]:
    """Admit, check every reused block's bytes, compute the rest, commit, release: tokens served from cache."""
    alloc = pool.new_allocation()
    covered = pool.adopt_prefix(alloc, tokens)
    pool.wait_restores(alloc)
    hashes = chain(tokens)
    for i in range(covered // BS):
        np.testing.assert_array_equal(device.kv[alloc.block_table[i]], kv_of(hashes[i]))
    assert pool.grow(alloc, len(tokens))
    for i in range(covered // BS, len(hashes)):  # the step computes these blocks' KV
        device.kv[alloc.block_table[i]] = kv_of(hashes[i])
    pool.commit_full_blocks(alloc, tokens, len(tokens))
    pool.release(alloc)
    pool.check_consistency()
    return covered, alloc


def test_evicted_prefixes_come_back_byte_for_byte():
    pool, device = make_pool()
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 50, 4 * BS + 1)) for _ in range(6)]  # 4 full blocks each; 5 usable
    for p in prompts:
        assert serve(pool, device, p)[0] == 0
    # every prompt but the last was evicted to the host; each comes back whole (4 blocks), from the host
    for p in prompts[:-1]:
        assert serve(pool, device, p)[0] == 4 * BS
    counters = pool.tier.counters()
    assert counters.host_hits >= 4 * 5 - 4  # the device cache may still hold a few blocks
    assert counters.bytes_to_device == counters.host_hits * BLOCK_BYTES
    assert counters.bytes_to_host == counters.spilled_blocks * BLOCK_BYTES == pool.counters().evictions * BLOCK_BYTES


def test_shared_prefix_continues_from_device_into_host():
    pool, device = make_pool(num_blocks=8)
    base = list(range(3 * BS))
    serve(pool, device, base + [99])
    for k in range(4):  # other prompts push the base's tail out, then its head
        serve(pool, device, [200 + k] * (4 * BS) + [1])
    covered, alloc = serve(pool, device, base + [7, 7, 7, 7, 8])
    assert covered == 3 * BS


def test_host_pool_stays_within_capacity():
    pool, device = make_pool(host_blocks=3)
    for k in range(6):
        serve(pool, device, [k] * (4 * BS) + [1])
    assert len(pool.tier) <= 3 and pool.tier.used_bytes <= 3 * BLOCK_BYTES
    assert pool.tier.counters().host_evictions == pool.tier.counters().spilled_blocks - len(pool.tier)


@pytest.mark.parametrize("started", [False, True])
def test_abort_mid_copy_leaks_nothing(started):
    pool, device = make_pool()
    prompt = list(range(4 * BS)) + [1]
    serve(pool, device, prompt)
    for k in range(2):
        serve(pool, device, [100 + k] * (4 * BS) + [1])  # the prompt's blocks now live on the host
    alloc = pool.new_allocation()
    covered = pool.adopt_prefix(alloc, prompt)
    assert covered > 0 and pool.pending_restores(alloc)
    if started:  # the first copy already landed, the rest still queued
        pool._restores[pool.pending_restores(alloc)[0]].result()
    pool.release(alloc)  # the request goes away with its restores in flight
    pool.check_consistency()
    assert not pool._restores and pool.free_blocks == pool.num_usable_blocks
    # every copy landed or was cancelled, but the spills the host tier still holds (waited for when taken)
    held = {id(c) for c in pool.tier._entries.values()}
    assert all(c.done or c.cancelled or id(c) in held for c in device.copies)
    # what is still findable holds the right bytes; cancelled blocks are not findable
    covered, _ = serve(pool, device, prompt)
    assert covered == (BS if started else 0)


def test_jax_kv_arrays_round_trip_through_the_host():
    """The same flow over real JAX KV arrays (KVArrayStore): 2 layers of (k, v) [blocks, BS, 1, 8]."""
    import jax.numpy as jnp

    from ember.runtime.state.host_tier_store import KVArrayStore

    num_blocks = 6
    holder = {"kv": [tuple(jnp.zeros((num_blocks, BS, 1, 8), jnp.float32) for _ in range(2)) for _ in range(2)]}
    store = KVArrayStore(lambda: holder["kv"], lambda kv: holder.update(kv=kv), layers=(0, 1))
    pool = TieredBlockPool(num_blocks, BS, store, HostTier(64 * 4 * BS * 32, 4 * BS * 32))

    def block_kv(h):  # (k, v) of both layers of a block, as the step would write them
        values = kv_of(h).reshape(2, BS, 1, 8)
        return [(values[0] + layer, values[1] - layer) for layer in range(2)]

    def serve_jax(tokens):
        alloc = pool.new_allocation()
        covered = pool.adopt_prefix(alloc, tokens)
        pool.wait_restores(alloc)
        hashes = chain(tokens)
        for i in range(covered // BS):
            for layer, (k, v) in enumerate(block_kv(hashes[i])):
                np.testing.assert_array_equal(np.asarray(holder["kv"][layer][0][alloc.block_table[i]]), k)
                np.testing.assert_array_equal(np.asarray(holder["kv"][layer][1][alloc.block_table[i]]), v)
        assert pool.grow(alloc, len(tokens))
        for i in range(covered // BS, len(hashes)):
            block, kv = alloc.block_table[i], list(holder["kv"])
            for layer, (k, v) in enumerate(block_kv(hashes[i])):
                kv[layer] = (kv[layer][0].at[block].set(k), kv[layer][1].at[block].set(v))
            holder["kv"] = kv
        pool.commit_full_blocks(alloc, tokens, len(tokens))
        pool.release(alloc)
        pool.check_consistency()
        return covered

    prompts = [[k] * (4 * BS) + [1] for k in range(3)]
    for p in prompts:
        serve_jax(p)
    assert serve_jax(prompts[0]) == 4 * BS and pool.tier.counters().host_hits >= 3


def test_data_bytes_counts_every_array():
    assert data_bytes((np.zeros(4, np.float32), {"v": np.zeros((2, 2), np.int8)})) == 20
