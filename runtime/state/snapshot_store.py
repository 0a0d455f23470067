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

Host tier. A registered snapshot that leaves the store (LRU eviction, or dropped with its KV block) is handed to
`on_spill` with its slot before the slot can be written again: the prefix cache's host tier (runtime/state/
host_tier.py) queues it to be copied out at the step's dispatch, before the forward and the save that overwrites
it. A snapshot the tier brings back is reserved and registered at once (`register_restored`), its bytes written by
the same dispatch; `reserve(keep=...)` leaves alone the slots the step being built still needs as they are.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Collection


class SnapshotStore:
    def __init__(self, first_slot: int, num_snapshots: int):
        if num_snapshots < 1:
            raise ValueError(f"a snapshot store needs >= 1 snapshot slot, got {num_snapshots}")
        self.first_slot, self.num_snapshots = first_slot, num_snapshots
        self._free: deque[int] = deque(range(first_slot, first_slot + num_snapshots))
        self._reserved: set[int] = set()
        self._slot_of: OrderedDict[bytes, int] = OrderedDict()  # registered, least recently used first
        self.saves = self.restores = self.evictions = 0
        # called with (chain hash, slot) of each registered snapshot leaving the store, before the slot is reused
        self.on_spill: list[Callable[[bytes, int], None]] = []

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
    def can_reserve(self, keep: Collection[int] = ()) -> bool:
        """Whether reserve(keep) would get a slot."""
        return bool(self._free) or any(slot not in keep for slot in self._slot_of.values())

    def reserve(self, keep: Collection[int] = ()) -> int | None:
        """A slot for a snapshot about to be saved (or brought back from the host), evicting the least recently
        used registered one not in `keep` when none is free; None when none can be had."""
        if self._free:
            slot = self._free.popleft()
        else:
            chain_hash = next((h for h, s in self._slot_of.items() if s not in keep), None)
            if chain_hash is None:
                return None
            slot = self._slot_of.pop(chain_hash)
            self.evictions += 1
            self._spill(chain_hash, slot)
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

    def register_restored(self, chain_hash: bytes, slot: int) -> None:
        """A reserved slot into which the host tier writes the snapshot of `chain_hash` before the step's forward:
        registered now (as a KV block restored from the host is), so the step's restore from it finds it."""
        if chain_hash in self._slot_of:
            raise ValueError("a snapshot restored from the host is already on the device")
        self._reserved.remove(slot)
        self._slot_of[chain_hash] = slot

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
            self._spill(chain_hash, slot)

    def _spill(self, chain_hash: bytes, slot: int) -> None:
        for spill in self.on_spill:
            spill(chain_hash, slot)

    # --- self-check (tests, debugging) --------------------------------------------------------------
    def all_free(self) -> bool:
        """No reservation is outstanding (registered snapshots are cache entries, not leaks)."""
        return not self._reserved

    def check_consistency(self, restoring: Collection[int] = ()) -> None:
        """restoring: the slots whose bytes the host tier writes at the next dispatch (each must be registered: a
        restore into a slot that changed hands would overwrite its new snapshot)."""
        free, registered = set(self._free), set(self._slot_of.values())
        assert set(restoring) <= registered, "a host restore into a snapshot slot that is not registered"
        assert len(free) == len(self._free), "a snapshot slot is free twice"
        assert len(registered) == len(self._slot_of), "a snapshot slot is registered twice"
        assert not (free & registered or free & self._reserved or registered & self._reserved), "slot in two states"
        everything = range(self.first_slot, self.first_slot + self.num_snapshots)
        assert free | registered | self._reserved == set(everything), "a snapshot slot went missing"
