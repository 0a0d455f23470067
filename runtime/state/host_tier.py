"""A host-memory tier under the device prefix cache: KV blocks evicted from the full-attention pool's cache are
copied to a bounded host pool, keyed by their chain hash, and a later prompt with that prefix gets them back by a
copy into free device blocks instead of recomputing them.

Flow (the engine's loop thread drives all of it):
  eviction   BlockPool.allocate evicts a cached block: `spill(hash, block)` queues it (nothing is copied yet; the
             block's new owner writes it only in the step being built)
  hit        KVCache.find_prefix continues a prefix past the device cache through hashes the tier holds; adopt
             takes the entries out of the host LRU (`take`), gives each a fresh device block, registers it in
             the device cache and queues its bytes to be written there (`restore(block, data)`)
  dispatch   StepExecutor.launch, before the step's forward, calls `dispatch(kv, copier)`: ONE gather of every
             queued spill (device -> host, started asynchronously, the batch's host arrays read at the next
             dispatch or when a hit needs them), then ONE scatter of every queued restore (host -> device)
So a step's copies are one gather and one scatter whatever the number of blocks, and both are ordered before the
forward that overwrites the spilled blocks or reads the restored ones.

Entries are one block of every paged layer, [layers, 2 (k, v), block_size, hkv, dh]; the LRU drops the least
recently spilled entry once `capacity_bytes` would be exceeded. A hash queued for a spill but not dispatched yet
is not findable (a prompt admitted in the same step recomputes it). A block evicted again while its restore is
still queued (its request aborted or preempted before the step ran) is spilled from the host bytes at hand.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class BlockCopier(Protocol):
    """The device side (runtime/execution/block_copies.py): one gather and one scatter over the paged layers."""

    def gather(self, kv: Any, blocks: Sequence[int]) -> Any:
        """A device array [layers, 2, >= n, block_size, hkv, dh] whose first n rows are the blocks, its copy to
        the host started."""
        ...

    def scatter(self, kv: Any, blocks: Sequence[int], data: Sequence[np.ndarray]) -> Any:
        """kv (donated) with one entry [layers, 2, block_size, hkv, dh] written into each block (distinct)."""
        ...


@dataclass(frozen=True)
class HostTierCounters:
    capacity_bytes: int
    used_bytes: int
    offloaded_blocks: int  # evicted device blocks copied to the host
    restored_blocks: int  # blocks a prefix hit brought back from the host
    restored_tokens: int  # prompt tokens those hits covered
    dropped_blocks: int  # host entries dropped to stay within capacity


class _Batch:
    """One gather's device array on its way to the host: read once, then sliced into its entries."""

    def __init__(self, array: Any):
        self.array = array
        self._host: np.ndarray | None = None

    def host(self) -> np.ndarray:
        if self._host is None:
            self._host = np.asarray(self.array)  # [layers, 2, n, bs, hkv, dh]; waits for the copy
            self.array = None
        return self._host


class HostTier:
    def __init__(self, capacity_bytes: int, block_bytes: int, block_size: int):
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        self.capacity_bytes, self.block_bytes, self.block_size = int(capacity_bytes), block_bytes, block_size
        self.capacity_blocks = max(0, self.capacity_bytes // block_bytes)
        # hash -> the block's host arrays, or (batch, index) while its gather is on the way
        self._entries: OrderedDict[bytes, np.ndarray | tuple[_Batch, int]] = OrderedDict()
        self._spills: list[tuple[bytes, int]] = []  # queued for the next dispatch: (hash, device block)
        self._restores: dict[int, np.ndarray] = {}  # device block -> host arrays to write at the next dispatch
        self._batches: list[_Batch] = []  # gathers dispatched, not yet read back
        self._lock = threading.Lock()  # the API thread may read counters while the loop thread changes them
        self._offloaded = self._restored = self._dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, chain_hash: bytes) -> bool:
        return chain_hash in self._entries

    @property
    def used_bytes(self) -> int:
        return len(self._entries) * self.block_bytes

    # --- the block pool's side ------------------------------------------------------------------------
    def spill(self, chain_hash: bytes, block: int) -> None:
        """A cached device block is being evicted (BlockPool.on_spill): copy it out at the next dispatch."""
        with self._lock:
            data = self._restores.pop(block, None)  # its restore never ran (the block's next owner writes it)
            if self.capacity_blocks == 0:
                return
            if data is not None:  # so the bytes are still here
                self._put(chain_hash, data)
            else:
                self._spills.append((chain_hash, block))

    def take(self, chain_hashes: Sequence[bytes]) -> list[np.ndarray]:
        """A prefix hit takes these entries out of the tier (before it allocates their device blocks, whose
        evictions may drop old entries): their host arrays, for `restore`."""
        with self._lock:
            self._restored += len(chain_hashes)
            return [self._take(h) for h in chain_hashes]

    def restore(self, block: int, data: np.ndarray) -> None:
        """Write a taken entry into device block `block` (registered under its hash by the caller)."""
        with self._lock:
            self._restores[block] = data

    # --- the executor's side --------------------------------------------------------------------------
    def dispatch(self, kv: Any, copier: BlockCopier) -> Any:
        """Issue the queued copies before a step's forward: one gather of the spills, then one scatter of the
        restores (a spilled block may be a restore's destination: it is read first). Returns the new kv."""
        with self._lock:
            self._read_back()
            spills = self._spills[-self.capacity_blocks :] if self._spills else []  # the rest would drop at once
            restores, self._spills, self._restores = self._restores, [], {}
            if spills:
                batch = _Batch(copier.gather(kv, [block for _, block in spills]))
                self._batches.append(batch)
                for index, (chain_hash, _) in enumerate(spills):
                    self._put(chain_hash, (batch, index))
        if restores:
            kv = copier.scatter(kv, list(restores), list(restores.values()))
        return kv

    @property
    def has_pending(self) -> bool:
        return bool(self._spills or self._restores)

    # --- entries ----------------------------------------------------------------------------------------
    def _put(self, chain_hash: bytes, data: np.ndarray | tuple[_Batch, int]) -> None:
        if self._entries.pop(chain_hash, None) is not None:
            self._dropped += 1  # an older copy of the same prefix
        self._entries[chain_hash] = data
        self._offloaded += 1
        while len(self._entries) > self.capacity_blocks:
            self._entries.popitem(last=False)
            self._dropped += 1

    def _take(self, chain_hash: bytes) -> np.ndarray:
        data = self._entries.pop(chain_hash)
        if isinstance(data, tuple):
            batch, index = data
            data = np.ascontiguousarray(batch.host()[:, :, index])
        return data

    def _read_back(self) -> None:
        """Turn the gathers of earlier dispatches into one host array per entry (so a batch's buffer goes)."""
        if not self._batches:
            return
        for chain_hash, data in list(self._entries.items()):
            if isinstance(data, tuple):
                batch, index = data
                self._entries[chain_hash] = np.ascontiguousarray(batch.host()[:, :, index])
        self._batches.clear()

    def counters(self) -> HostTierCounters:
        with self._lock:
            return HostTierCounters(
                self.capacity_bytes,
                self.used_bytes,
                self._offloaded,
                self._restored,
                self._restored * self.block_size,
                self._dropped,
            )

    def check_consistency(self) -> None:
        """Raise AssertionError unless the tier holds at most its capacity, in whole blocks of the right size, and
        every entry that came in left by a restore or a drop or is still held (nothing leaks or vanishes)."""
        assert len(self._entries) <= self.capacity_blocks and self.used_bytes <= self.capacity_bytes
        assert len(self._entries) == self._offloaded - self._restored - self._dropped
        for data in self._entries.values():
            if not isinstance(data, tuple):
                assert data.nbytes == self.block_bytes, f"a host entry of {data.nbytes} bytes"
