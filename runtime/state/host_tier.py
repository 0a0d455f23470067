"""A host-memory tier under the device prefix cache: what the device cache evicts is copied to a bounded host pool,
keyed by its chain hash, and a later prompt with that prefix gets it back by a copy instead of recomputing it.

Two families of entries share one byte budget and one LRU:
  BLOCKS     KV blocks of the full-attention pool: one block of every paged layer, [layers, 2 (k, v), block_size,
             hkv, dh]; their device places are blocks
  SNAPSHOTS  recurrent-state snapshots of plans with slot state (runtime/state/snapshot_store.py): one snapshot slot
             of every slot layer, its arrays' bytes end to end, [snapshot_bytes] uint8; their device places are
             snapshot slots. A snapshot costs what it costs (on a Qwen3-Next-80B shape ~75 MB, float32 delta-rule
             state of 36 layers: the bytes of ~200 KV blocks of 16 tokens), in the same LRU as the blocks.
The flows are the same for both (the engine's loop thread drives all of it):
  eviction   a block the pool evicts (BlockPool.on_spill) or a snapshot the store lets go of (SnapshotStore.on_spill:
             LRU eviction, or its KV block evicted): `spill(hash, place, family)` queues it (nothing is copied yet:
             the place's next owner writes it only in the step being built)
  hit        KVCache.find_prefix continues a prefix past the device cache through hashes the tier holds, and the
             snapshot planner resumes at a depth whose snapshot the tier holds; adoption takes the entries out of the
             host LRU (`take`), gives each a fresh device place, registers it at once and queues its bytes to be
             written there (`restore(place, entry, family)`)
  dispatch   StepExecutor.launch, before the step's forward and the step's slot copies, calls `dispatch(kv, blocks,
             snapshots)`: per family ONE gather of every queued spill (device -> host in pieces of at most 64 entries,
             asynchronously, into pinned host memory on a GPU), then per family ONE scatter of every queued restore
             (host -> device, whole pieces)
So a step's copies are one gather and one scatter per family whatever their number, all ordered before the forward
that overwrites a spilled place (a snapshot slot is overwritten by a save after the forward, or by a restore
dispatched after the gathers) or reads a restored one.

Entries are rows of a gather piece's host array [n, *entry] (nothing is copied per entry). The spills of a step are
gathered in reverse eviction order: the pool evicts a chain tail first, so its blocks land head first, in the order
a later hit restores them, and a restore moves whole pieces (a chain spilled together comes back as the pieces it
went out as). A piece's memory goes when its last entry does; once fewer than half its rows are entries, the
survivors are copied into a piece of their own (at a dispatch), so the host holds at most twice `used_bytes` in
pieces. The LRU drops the least recently spilled entry, of either family, once `capacity_bytes` would be exceeded
(a step's snapshots enter before its blocks: a snapshot is of no use without the blocks of its prefix). A hash
queued for a spill but not dispatched yet is not findable (a prompt admitted in the same step recomputes it). A
place evicted again while its restore is still queued (the step that was to write it never dispatched its copies,
e.g. its launch failed) is spilled from the host bytes at hand.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

BLOCKS, SNAPSHOTS = "blocks", "snapshots"  # the families of entries
_GATHER_ORDER = (SNAPSHOTS, BLOCKS)  # a step's snapshots enter the LRU before its blocks (the older of the two)


class HostCopier(Protocol):
    """The device side of one family (runtime/execution/block_copies.py: KV blocks over the paged layers;
    runtime/execution/snapshot_copies.py: snapshots over the slot layers): one gather and one scatter."""

    def gather(self, kv: Any, places: Sequence[int]) -> list[Any]:
        """Host arrays [n_i, *entry] whose rows are the places in order (sum n_i = len(places)), their copies under
        way (a read waits for them)."""
        ...

    def scatter(self, kv: Any, places: Sequence[int], entries: Sequence[HostEntry]) -> Any:
        """kv (donated) with each entry's bytes written into its place (distinct)."""
        ...

    def take_rows(self, array: Any, rows: Sequence[int]) -> Any:
        """A host array of these rows of a gather piece's array, in the same kind of memory."""
        ...


@dataclass(frozen=True)
class HostTierCounters:
    capacity_bytes: int
    used_bytes: int  # blocks and snapshots
    offloaded_blocks: int  # evicted device blocks copied to the host
    restored_blocks: int  # blocks a prefix hit brought back from the host
    restored_tokens: int  # prompt tokens those hits covered
    dropped_blocks: int  # host entries dropped to stay within capacity
    snapshot_bytes: int  # of used_bytes, held by recurrent-state snapshots
    offloaded_snapshots: int  # snapshots the device store let go of, copied to the host
    restored_snapshots: int  # snapshots a prefix hit brought back from the host
    dropped_snapshots: int  # host snapshots dropped to stay within capacity
    offloaded_bytes: int  # bytes that entered the host tier (blocks and snapshots)
    restored_bytes: int  # bytes prefix hits took back to the device


class _Piece:
    """One gather piece: its host array [n, *entry] (on a GPU in pinned host memory, so both of its crossings are
    DMA transfers; block_copies.py), and which of the tier's entries ((family, hash)) are its rows."""

    def __init__(self, array: Any):
        self.array, self.rows = array, int(array.shape[0])
        self.keys: set[tuple[str, bytes]] = set()

    def host(self) -> np.ndarray:
        """The piece's bytes as a numpy array (waits for its copy; a copy itself where the array is a JAX one)."""
        return np.asarray(self.array)


@dataclass(frozen=True)
class HostEntry:
    """One host entry: row `index` of a gather piece."""

    piece: _Piece
    index: int

    def data(self) -> np.ndarray:
        return self.piece.host()[self.index]  # [*entry]


class _Family:
    """One family's entry size, queued copies and counts."""

    def __init__(self, entry_bytes: int):
        self.entry_bytes = entry_bytes
        self.spills: list[tuple[bytes, int]] = []  # queued for the next dispatch: (hash, device place)
        self.restores: dict[int, HostEntry] = {}  # device place -> the entry to write at the next dispatch
        self.held = self.offloaded = self.restored = self.dropped = 0


class HostTier:
    def __init__(self, capacity_bytes: int, block_bytes: int, block_size: int, snapshot_bytes: int = 0):
        """snapshot_bytes: one recurrent-state snapshot's bytes (0: the plan has none, the tier keeps blocks only)."""
        if block_bytes <= 0 or snapshot_bytes < 0:
            raise ValueError(f"entry sizes must be positive, got {block_bytes} and {snapshot_bytes}")
        self.capacity_bytes, self.block_bytes, self.block_size = int(capacity_bytes), block_bytes, block_size
        self.snapshot_bytes = snapshot_bytes
        self._families = {BLOCKS: _Family(block_bytes)}
        if snapshot_bytes:
            self._families[SNAPSHOTS] = _Family(snapshot_bytes)
        self._entries: OrderedDict[tuple[str, bytes], HostEntry] = OrderedDict()  # (family, hash) -> row, LRU first
        self._used = 0
        self._thinned: set[_Piece] = set()  # pieces that lost entries since the last dispatch
        self._lock = threading.Lock()  # the API thread may read counters while the loop thread changes them

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, chain_hash: bytes) -> bool:
        return (BLOCKS, chain_hash) in self._entries

    def holds(self, chain_hash: bytes, family: str = BLOCKS) -> bool:
        return (family, chain_hash) in self._entries

    @property
    def keeps_snapshots(self) -> bool:
        return SNAPSHOTS in self._families

    @property
    def capacity_blocks(self) -> int:
        return self.capacity_bytes // self.block_bytes

    def capacity_of(self, family: str) -> int:
        """The most entries of `family` the tier holds (were it to hold nothing else)."""
        return self.capacity_bytes // self._families[family].entry_bytes

    @property
    def used_bytes(self) -> int:
        return self._used

    # --- the device cache's side (BlockPool.on_spill, SnapshotStore.on_spill, adoption) ----------------
    def spill(self, chain_hash: bytes, place: int, family: str = BLOCKS) -> None:
        """A cached device block or snapshot is being evicted: copy it out at the next dispatch."""
        with self._lock:
            fam = self._families[family]
            entry = fam.restores.pop(place, None)  # its restore never ran (the place's next owner writes it)
            if fam.entry_bytes > self.capacity_bytes:
                return
            if entry is not None:  # so the bytes are still here
                self._put((family, chain_hash), entry)
            else:
                fam.spills.append((chain_hash, place))

    def take(self, chain_hashes: Sequence[bytes], family: str = BLOCKS) -> list[HostEntry]:
        """A prefix hit takes these entries out of the tier (before it allocates their device places, whose
        evictions may drop old entries), for `restore`. An entry is handed out once."""
        with self._lock:
            if missing := [h for h in chain_hashes if (family, h) not in self._entries]:
                raise KeyError(f"{len(missing)} {family} not in the host tier (an entry is handed out once)")
            self._families[family].restored += len(chain_hashes)
            return [self._remove((family, h)) for h in chain_hashes]

    def restore(self, place: int, entry: HostEntry, family: str = BLOCKS) -> None:
        """Write a taken entry into device place `place` (registered under its hash by the caller)."""
        with self._lock:
            self._families[family].restores[place] = entry

    def pending_restores(self, family: str = BLOCKS) -> Mapping[int, HostEntry]:
        """Places whose restore the next dispatch writes (a copy: consistency checks)."""
        with self._lock:
            return dict(self._families[family].restores)

    # --- the executor's side --------------------------------------------------------------------------
    def dispatch(self, kv: Any, blocks: HostCopier, snapshots: HostCopier | None = None) -> Any:
        """Issue the queued copies before a step's forward: each family's gather of its spills, then each family's
        scatter of its restores (a spilled place may be a restore's destination: it is read first). Returns the new
        kv."""
        copiers = {BLOCKS: blocks, SNAPSHOTS: snapshots}
        restores = {}
        with self._lock:
            self._compact(copiers)
            for name in _GATHER_ORDER:
                if (fam := self._families.get(name)) is None:
                    continue
                limit = self.capacity_bytes // fam.entry_bytes
                spills = fam.spills[-limit:] if limit and fam.spills else []  # the rest would drop at once
                restores[name], fam.spills, fam.restores = fam.restores, [], {}
                spills.reverse()  # chains were evicted tail first: gathered head first, as a hit restores them
                if spills:
                    hashes = iter(chain_hash for chain_hash, _ in spills)
                    for array in copiers[name].gather(kv, [place for _, place in spills]):
                        piece = _Piece(array)
                        for index in range(piece.rows):
                            self._put((name, next(hashes)), HostEntry(piece, index))
        for name, queued in restores.items():
            if queued:
                kv = copiers[name].scatter(kv, list(queued), list(queued.values()))
        return kv

    @property
    def has_pending(self) -> bool:
        return any(fam.spills or fam.restores for fam in self._families.values())

    # --- entries ----------------------------------------------------------------------------------------
    def _put(self, key: tuple[str, bytes], entry: HostEntry) -> None:
        fam = self._families[key[0]]
        if key in self._entries:
            self._remove(key)
            fam.dropped += 1  # an older copy of the same prefix
        self._entries[key] = entry
        entry.piece.keys.add(key)
        fam.held, fam.offloaded = fam.held + 1, fam.offloaded + 1
        self._used += fam.entry_bytes
        while self._used > self.capacity_bytes:
            oldest = next(iter(self._entries))
            self._remove(oldest)
            self._families[oldest[0]].dropped += 1

    def _remove(self, key: tuple[str, bytes]) -> HostEntry:
        entry = self._entries.pop(key)
        fam = self._families[key[0]]
        fam.held -= 1
        self._used -= fam.entry_bytes
        entry.piece.keys.discard(key)
        self._thinned.add(entry.piece)
        return entry

    def _compact(self, copiers: Mapping[str, HostCopier | None]) -> None:
        """Copy the survivors of each piece left less than half full into a piece of their own, so a dropped
        piece's memory goes (a piece holds entries of one family)."""
        for piece in self._thinned:
            if piece.keys and 2 * len(piece.keys) < piece.rows:
                keys = sorted(piece.keys, key=lambda k: self._entries[k].index)  # rows stay in order
                copier = copiers[keys[0][0]]
                compact = _Piece(copier.take_rows(piece.array, [self._entries[k].index for k in keys]))
                compact.keys, piece.keys = set(keys), set()
                for index, key in enumerate(keys):
                    self._entries[key] = HostEntry(compact, index)
        self._thinned.clear()

    def counters(self) -> HostTierCounters:
        with self._lock:
            blocks, snapshots = self._families[BLOCKS], self._families.get(SNAPSHOTS, _Family(0))
            families = self._families.values()
            return HostTierCounters(
                self.capacity_bytes,
                self._used,
                blocks.offloaded,
                blocks.restored,
                blocks.restored * self.block_size,
                blocks.dropped,
                snapshots.held * snapshots.entry_bytes,
                snapshots.offloaded,
                snapshots.restored,
                snapshots.dropped,
                sum(f.offloaded * f.entry_bytes for f in families),
                sum(f.restored * f.entry_bytes for f in families),
            )

    def check_consistency(self) -> None:
        """Raise AssertionError unless the tier holds at most its capacity, in whole entries of the right size;
        every entry that came in left by a restore or a drop or is still held (nothing leaks or vanishes); and no
        row of a piece is both held and queued for a restore, or queued twice (an entry is handed out once)."""
        with self._lock:
            assert self._used <= self.capacity_bytes, f"{self._used} bytes held of {self.capacity_bytes}"
            assert self._used == sum(f.held * f.entry_bytes for f in self._families.values())
            rows: set[tuple[int, int]] = set()
            for name, fam in self._families.items():
                held = sum(1 for family, _ in self._entries if family == name)
                assert held == fam.held == fam.offloaded - fam.restored - fam.dropped, f"{name}: entries leaked"
            for key, entry in self._entries.items():
                assert key in entry.piece.keys and 0 <= entry.index < entry.piece.rows
                array = entry.piece.array
                nbytes = int(np.prod(array.shape[1:])) * np.dtype(array.dtype).itemsize
                assert nbytes == self._families[key[0]].entry_bytes, f"a host entry of {nbytes} bytes"
                rows.add((id(entry.piece), entry.index))
            for fam in self._families.values():
                for entry in fam.restores.values():
                    row = (id(entry.piece), entry.index)
                    assert row not in rows, "a host entry handed out twice"
                    rows.add(row)
