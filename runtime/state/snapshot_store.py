"""Recurrent-state snapshots for the prefix cache of plans with slot state (runtime/state/slot_pool.py).

A KV prefix hit alone cannot resume a recurrent layer: its state after the prefix is one fixed-size matrix, not
per-token entries. So at block-aligned positions a request's live slot state is copied into a snapshot slot,
keyed by the chain hash of the block that ends there (runtime/state/block_pool.py block_hash: equal hashes mean
equal whole prefixes). A later request whose prompt matches up to such a block copies the snapshot into its own
live slot and skips those tokens.

Snapshot slots are extra entries of the same device arrays as the live slots (indices first_slot ..
first_slot + num_snapshots - 1, after the live ones), so saving and restoring are copies within one array. This
store only does the bookkeeping; the device copies are the executor's (runtime/execution/slot_copies.py). A
snapshot is either free, reserved (its copy is scheduled, the step not yet applied) or registered under a hash.
Registered snapshots form an LRU: a reservation with no free slot evicts the least recently used one; the KV
pool also drops a snapshot when it evicts the block of its hash (the prefix is then unreachable anyway).
Reserved snapshots are never evicted.

The interface (lookup / touch / reserve / register / cancel / drop) is what a host-memory tier would sit behind.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class SnapshotStore:
    def __init__(self, first_slot: int, num_snapshots: int):
        if num_snapshots < 1:
            raise ValueError(f"a snapshot store needs >= 1 snapshot slot, got {num_snapshots}")
        self.first_slot, self.num_snapshots = first_slot, num_snapshots
        self._free: deque[int] = deque(range(first_slot, first_slot + num_snapshots))
        self._reserved: set[int] = set()
        self._slot_of: OrderedDict[bytes, int] = OrderedDict()  # registered, least recently used first
        self.saves = self.restores = self.evictions = 0

    # --- lookups ------------------------------------------------------------------------------------
    def lookup(self, chain_hash: bytes) -> int | None:
        """The snapshot slot holding the state after the prefix of `chain_hash`, None if none; no side effects."""
        return self._slot_of.get(chain_hash)

    def touch(self, chain_hash: bytes) -> int:
        """A snapshot about to be restored: its slot, now the most recently used."""
        self._slot_of.move_to_end(chain_hash)
        self.restores += 1
        return self._slot_of[chain_hash]

    @property
    def free_snapshots(self) -> int:
        """Snapshot slots a reservation can get now: free ones and registered (evictable) ones."""
        return len(self._free) + len(self._slot_of)

    @property
    def registered(self) -> tuple[bytes, ...]:
        return tuple(self._slot_of)

    # --- lifecycle ------------------------------------------------------------------------------------
    def reserve(self) -> int | None:
        """A slot for a snapshot about to be saved, evicting the least recently used registered one when none
        is free; None when every slot is reserved."""
        if self._free:
            slot = self._free.popleft()
        elif self._slot_of:
            _, slot = self._slot_of.popitem(last=False)
            self.evictions += 1
        else:
            return None
        self._reserved.add(slot)
        return slot

    def register(self, chain_hash: bytes, slot: int) -> None:
        """A reserved slot now holds the state after the prefix of `chain_hash` (its copy was applied). A hash
        already registered (two equal prompts side by side) keeps its snapshot; this slot is freed."""
        self._reserved.remove(slot)
        if chain_hash in self._slot_of:
            self._free.append(slot)
            return
        self._slot_of[chain_hash] = slot
        self.saves += 1

    def cancel(self, slot: int) -> None:
        """A reserved slot whose save will not be registered (its request was aborted or preempted)."""
        self._reserved.remove(slot)
        self._free.append(slot)

    def drop(self, chain_hash: bytes) -> None:
        """Forget the snapshot of `chain_hash`, if any (its KV block was evicted)."""
        slot = self._slot_of.pop(chain_hash, None)
        if slot is not None:
            self._free.append(slot)
            self.evictions += 1

    # --- self-check (tests, debugging) --------------------------------------------------------------
    def all_free(self) -> bool:
        """No reservation is outstanding (registered snapshots are cache entries, not leaks)."""
        return not self._reserved

    def check_consistency(self) -> None:
        free, registered = set(self._free), set(self._slot_of.values())
        assert len(free) == len(self._free), "a snapshot slot is free twice"
        assert len(registered) == len(self._slot_of), "a snapshot slot is registered twice"
        assert not (free & registered or free & self._reserved or registered & self._reserved), "slot in two states"
        everything = range(self.first_slot, self.first_slot + self.num_snapshots)
        assert free | registered | self._reserved == set(everything), "a snapshot slot went missing"
