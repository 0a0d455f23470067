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
             queued spill (device -> host in pieces of at most 64 blocks, asynchronously, into pinned host
             memory on a GPU), then ONE scatter of every queued restore (host -> device, whole pieces)
So a step's copies are one gather and one scatter whatever the number of blocks, and both are ordered before the
forward that overwrites the spilled blocks or reads the restored ones.

Entries are one block of every paged layer, [layers, 2 (k, v), block_size, hkv, dh], held as a row of a gather
piece's host array [n, layers, 2, block_size, hkv, dh] (block-major; nothing is copied per entry). The spills of
a step are gathered in reverse eviction order: the pool evicts a chain tail first, so its blocks land head first,
in the order a later hit restores them, and a restore moves whole pieces (a chain spilled together comes back
as the pieces it went out as). A piece's memory goes when its last entry does; once fewer than half its rows are
entries, the survivors are copied into a piece of their own (at a dispatch), so the host holds at most twice
`used_bytes` in pieces. The LRU drops the least recently spilled entry once `capacity_bytes` would be
exceeded. A hash queued for a spill but not dispatched yet is not findable (a prompt admitted in the same step
recomputes it). A block evicted again while its restore is still queued (its request aborted or preempted before
the step ran) is spilled from the host bytes at hand.
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

    def gather(self, kv: Any, blocks: Sequence[int]) -> list[Any]:
        """Host arrays [n_i, layers, 2, block_size, hkv, dh] whose rows are the blocks in order (sum n_i =
        len(blocks)), their copies under way (a read waits for them)."""
        ...

    def scatter(self, kv: Any, blocks: Sequence[int], entries: Sequence[HostEntry]) -> Any:
        """kv (donated) with each entry's bytes written into its block (distinct)."""
        ...

    def take_rows(self, array: Any, rows: Sequence[int]) -> Any:
        """A host array of these rows of a gather piece's array, in the same kind of memory."""
        ...


@dataclass(frozen=True)
class HostTierCounters:
    capacity_bytes: int
    used_bytes: int
    offloaded_blocks: int  # evicted device blocks copied to the host
    restored_blocks: int  # blocks a prefix hit brought back from the host
    restored_tokens: int  # prompt tokens those hits covered
    dropped_blocks: int  # host entries dropped to stay within capacity


class _Piece:
    """One gather piece: its host array [n, layers, 2, bs, hkv, dh] (on a GPU in pinned host memory, so both of its
    crossings are DMA transfers; block_copies.py), and which of the tier's entries are its rows."""

    def __init__(self, array: Any):
        self.array, self.rows = array, int(array.shape[0])
        self.keys: set[bytes] = set()

    def host(self) -> np.ndarray:
        """The piece's bytes as a numpy array (waits for its copy; a copy itself where the array is a JAX one)."""
        return np.asarray(self.array)


@dataclass(frozen=True)
class HostEntry:
    """One host block: row `index` of a gather piece."""

    piece: _Piece
    index: int

    def data(self) -> np.ndarray:
        return self.piece.host()[self.index]  # [layers, 2, bs, hkv, dh]


class HostTier:
    def __init__(self, capacity_bytes: int, block_bytes: int, block_size: int):
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        self.capacity_bytes, self.block_bytes, self.block_size = int(capacity_bytes), block_bytes, block_size
        self.capacity_blocks = max(0, self.capacity_bytes // block_bytes)
        self._entries: OrderedDict[bytes, HostEntry] = OrderedDict()  # hash -> its row, LRU first
        self._spills: list[tuple[bytes, int]] = []  # queued for the next dispatch: (hash, device block)
        self._restores: dict[int, HostEntry] = {}  # device block -> the entry to write at the next dispatch
        self._thinned: set[_Piece] = set()  # pieces that lost entries since the last dispatch
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
            entry = self._restores.pop(block, None)  # its restore never ran (the block's next owner writes it)
            if self.capacity_blocks == 0:
                return
            if entry is not None:  # so the bytes are still here
                self._put(chain_hash, entry)
            else:
                self._spills.append((chain_hash, block))

    def take(self, chain_hashes: Sequence[bytes]) -> list[HostEntry]:
        """A prefix hit takes these entries out of the tier (before it allocates their device blocks, whose
        evictions may drop old entries), for `restore`."""
        with self._lock:
            self._restored += len(chain_hashes)
            return [self._remove(h) for h in chain_hashes]

    def restore(self, block: int, entry: HostEntry) -> None:
        """Write a taken entry into device block `block` (registered under its hash by the caller)."""
        with self._lock:
            self._restores[block] = entry

    # --- the executor's side --------------------------------------------------------------------------
    def dispatch(self, kv: Any, copier: BlockCopier) -> Any:
        """Issue the queued copies before a step's forward: one gather of the spills, then one scatter of the
        restores (a spilled block may be a restore's destination: it is read first). Returns the new kv."""
        with self._lock:
            self._compact(copier)
            spills = self._spills[-self.capacity_blocks :] if self._spills else []  # the rest would drop at once
            restores, self._spills, self._restores = self._restores, [], {}
            spills.reverse()  # chains were evicted tail first: gathered head first, as a hit restores them
            if spills:
                hashes = iter(chain_hash for chain_hash, _ in spills)
                for array in copier.gather(kv, [block for _, block in spills]):
                    piece = _Piece(array)
                    for index in range(piece.rows):
                        self._put(next(hashes), HostEntry(piece, index))
        if restores:
            kv = copier.scatter(kv, list(restores), list(restores.values()))
        return kv

    @property
    def has_pending(self) -> bool:
        return bool(self._spills or self._restores)

    # --- entries ----------------------------------------------------------------------------------------
    def _put(self, chain_hash: bytes, entry: HostEntry) -> None:
        if chain_hash in self._entries:
            self._remove(chain_hash)
            self._dropped += 1  # an older copy of the same prefix
        self._entries[chain_hash] = entry
        entry.piece.keys.add(chain_hash)
        self._offloaded += 1
        while len(self._entries) > self.capacity_blocks:
            self._remove(next(iter(self._entries)))
            self._dropped += 1

    def _remove(self, chain_hash: bytes) -> HostEntry:
        entry = self._entries.pop(chain_hash)
        entry.piece.keys.discard(chain_hash)
        self._thinned.add(entry.piece)
        return entry

    def _compact(self, copier: BlockCopier) -> None:
        """Copy the survivors of each piece left less than half full into a piece of their own, so a dropped
        piece's memory goes."""
        for piece in self._thinned:
            if piece.keys and 2 * len(piece.keys) < piece.rows:
                keys = sorted(piece.keys, key=lambda k: self._entries[k].index)  # rows stay in order
                compact = _Piece(copier.take_rows(piece.array, [self._entries[k].index for k in keys]))
                compact.keys, piece.keys = set(keys), set()
                for index, chain_hash in enumerate(keys):
                    self._entries[chain_hash] = HostEntry(compact, index)
        self._thinned.clear()

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
        for chain_hash, entry in self._entries.items():
            assert chain_hash in entry.piece.keys and 0 <= entry.index < entry.piece.rows
            array = entry.piece.array
            nbytes = int(np.prod(array.shape[1:])) * np.dtype(array.dtype).itemsize
            assert nbytes == self.block_bytes, f"a host entry of {nbytes} bytes"
