"""A host-memory tier under the device prefix cache: KV blocks evicted from a BlockPool's cache spill to a
bounded host pool, keyed by their chain hash, and a later prompt with that prefix brings them back by a copy
instead of recomputing them.

  TieredBlockPool   a BlockPool whose evictions spill (the block's bytes copied out before its reuse; no change
                    to BlockPool: its LRU order says which cached blocks an allocation will evict) and whose
                    prefix matches continue past the device cache into the host tier: each host hit gets a
                    fresh device block, a host -> device copy, and is registered in the device cache again
  HostTier          the bounded host pool: LRU over chain hashes, each entry the copy of one block (or the
                    copy still in flight); over capacity the least recently spilled entries are dropped
  BlockStore        where a pool's blocks live on the device (the plan's KV arrays: host_tier_store.py's
                    KVArrayStore): `read` starts a copy of one block out and returns a handle (`result()`
                    gives its host arrays), `write` starts the copy of host arrays into a block, a handle too

Copies are asynchronous: a spill's device -> host copy is started at eviction (ordered before whatever
overwrites the block) and waited for only when the entry is brought back; a restore's host -> device copy is
started at admission and waited for (`wait_restores`) before the request's first step reads the block. A
request aborted while its restores are in flight releases its blocks as any other request does
(`abort_restores`): a copy not yet started is cancelled and its block forgotten by the cache (it never held
the KV), one under way is waited for; nothing stays allocated or in flight.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .block_pool import BlockPool, KVAllocation, block_hash


class CopyHandle(Protocol):
    def result(self) -> Any: ...

    def cancel(self) -> bool: ...


class BlockStore(Protocol):
    def read(self, block: int) -> CopyHandle: ...

    def write(self, block: int, data: Any) -> CopyHandle: ...


def data_bytes(data: Any) -> int:
    """Bytes of a block's host copy (an array or a tuple / dict of arrays)."""
    if isinstance(data, dict):
        data = tuple(data.values())
    if isinstance(data, (tuple, list)):
        return sum(data_bytes(d) for d in data)
    return int(np.asarray(data).nbytes)


@dataclass(frozen=True)
class HostTierCounters:
    spilled_blocks: int  # evicted device blocks copied to the host
    host_hits: int  # blocks a prefix match brought back from the host
    bytes_to_host: int
    bytes_to_device: int
    host_evictions: int  # host entries dropped to stay within capacity


class HostTier:
    """Bounded host pool of evicted KV blocks by chain hash (LRU: oldest spill dropped first)."""

    def __init__(self, capacity_bytes: int, block_bytes: int):
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        self.capacity_blocks = max(0, capacity_bytes // block_bytes)
        self.block_bytes = block_bytes
        self._entries: OrderedDict[bytes, CopyHandle] = OrderedDict()
        self._spilled = self._hits = self._to_host = self._to_device = self._dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, chain_hash: bytes) -> bool:
        return chain_hash in self._entries

    @property
    def used_bytes(self) -> int:
        return len(self._entries) * self.block_bytes

    def put(self, chain_hash: bytes, copy: CopyHandle) -> None:
        """Keep a block's copy (in flight or done) under its hash, dropping the oldest entries over capacity."""
        if self.capacity_blocks == 0:
            copy.cancel()
            return
        if chain_hash in self._entries:
            self._entries.pop(chain_hash).cancel()
        self._entries[chain_hash] = copy
        self._spilled += 1
        self._to_host += self.block_bytes
        while len(self._entries) > self.capacity_blocks:
            _, oldest = self._entries.popitem(last=False)
            oldest.cancel()
            self._dropped += 1

    def take(self, chain_hash: bytes) -> Any:
        """The block's host arrays (waiting for its copy out if still in flight); the entry leaves the tier."""
        data = self._entries.pop(chain_hash).result()
        self._hits += 1
        self._to_device += self.block_bytes
        return data

    def counters(self) -> HostTierCounters:
        return HostTierCounters(self._spilled, self._hits, self._to_host, self._to_device, self._dropped)


class TieredBlockPool(BlockPool):
    """A BlockPool whose prefix cache has a host tier below it (module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, store: BlockStore, tier: HostTier, kind: str = "kv"):
        super().__init__(num_blocks, block_size, kind)
        self.store = store
        self.tier = tier
        self._restores: dict[int, CopyHandle] = {}  # device block -> its host -> device copy in flight

    def allocate(self, n: int) -> list[int]:
        """BlockPool.allocate, each cached block it will evict (the least recently used, taken once the plain
        free list runs out) first copied out to the host tier: the copy is issued before the block's reuse,
        so it reads the evicted KV."""
        if n <= self.free_blocks:
            for block in itertools.islice(self._cached_free, max(0, n - len(self._free))):
                self._wait_restore(block)  # a block still being restored lands before it is copied out again
                self.tier.put(self._hash_of_block[block], self.store.read(block))
        return super().allocate(n)

    def adopt_prefix(self, alloc: KVAllocation, token_ids: Sequence[int]) -> int:
        """BlockPool.adopt_prefix, then the chain continued block by block: a block still in the device cache
        is shared, one in the host tier gets a device block (evicting, and so spilling, the least recently
        used cached block if no block is plainly free: the blocks this request took are referenced, never
        evicted), a host -> device copy and its registration; the first block in neither ends the prefix."""
        covered = super().adopt_prefix(alloc, token_ids)
        bs, parent = self.block_size, (alloc.block_hashes[-1] if alloc.block_hashes else None)
        for i in range(len(alloc.block_table), (len(token_ids) - 1) // bs):
            chain_hash = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            block = self._block_of_hash.get(chain_hash)
            if block is not None:
                self._share(block)
            elif chain_hash in self.tier and self.free_blocks > 0:
                (block,) = self.allocate(1)
                self._restores[block] = self.store.write(block, self.tier.take(chain_hash))
                self._block_of_hash[chain_hash] = block
                self._hash_of_block[block] = chain_hash
            else:
                break
            alloc.block_table.append(block)
            alloc.block_hashes.append(chain_hash)
            parent = chain_hash
            covered += bs
        return covered

    def pending_restores(self, alloc: KVAllocation) -> list[int]:
        """The allocation's blocks whose host -> device copy is still in flight."""
        return [b for b in alloc.block_table if b in self._restores]

    def wait_restores(self, alloc: KVAllocation) -> None:
        """Block until every restore of the allocation's blocks has landed (before its first step reads them)."""
        for block in self.pending_restores(alloc):
            self._wait_restore(block)

    def abort_restores(self, alloc: KVAllocation) -> None:
        """A request going away mid-copy: cancel its restores that have not started, wait for the rest (the
        block must not be handed out while a copy still writes it); its blocks are then released as usual."""
        for block in self.pending_restores(alloc):
            copy = self._restores.pop(block)
            if self._ref[block] == 1 and copy.cancel():  # never written: forget its hash (no one finds empty KV)
                del self._block_of_hash[self._hash_of_block.pop(block)]
            else:  # running, done, or shared with another request that needs it
                copy.result()

    def release(self, alloc: KVAllocation) -> None:
        self.abort_restores(alloc)
        super().release(alloc)

    def _wait_restore(self, block: int) -> None:
        copy = self._restores.pop(block, None)
        if copy is not None:
            copy.result()


def default_host_bytes(fraction: float = 0.25) -> int:
    """The host tier's default size: `fraction` of the memory the host has available now."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * fraction)
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") * fraction)
