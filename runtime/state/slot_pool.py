"""Fixed-size per-request state (a slot state kind, e.g. a recurrent layer's conv window and delta-rule matrix):
one slot per running request, out of a pool sized when the engine starts.

The arrays themselves live on the device (Model.new_kv: [slots, ...] per layer of the kind); this pool hands out
their indices. A request takes a slot when admitted and gives it back when it finishes, is aborted or is
preempted (it then recomputes from position 0, where the plan starts its slot from a zero state, or resumes
from a prefix-cache snapshot). A cached KV prefix alone cannot restore a recurrent state
(`supports_prefix_reuse` is False): the prefix cache of such plans resumes from recurrent-state snapshots
(runtime/state/snapshot_store.py, runtime/scheduling/prefix_snapshots.py), and is off without them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

FREED = -1


@dataclass(eq=False)
class SlotAllocation:
    kind: str
    slot: int  # FREED once handed back


class SlotPool:
    supports_prefix_reuse = False

    def __init__(self, num_slots: int, kind: str):
        if num_slots < 1:
            raise ValueError(f"a slot pool needs >= 1 slot, got {num_slots}")
        self.kind, self.num_slots = kind, num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._taken: set[int] = set()

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def can_allocate(self) -> bool:
        return bool(self._free)

    def new_allocation(self) -> SlotAllocation:
        if not self._free:
            raise RuntimeError(f"no free slot of state kind {self.kind!r} ({self.num_slots} slots)")
        slot = self._free.popleft()
        self._taken.add(slot)
        return SlotAllocation(self.kind, slot)

    def release(self, allocation: SlotAllocation) -> None:
        if allocation.slot == FREED:
            return
        self._taken.remove(allocation.slot)
        self._free.append(allocation.slot)
        allocation.slot = FREED

    def all_free(self) -> bool:
        return not self._taken and len(self._free) == self.num_slots

    def check_consistency(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "a slot is free twice"
        assert not free & self._taken, "a slot is both free and taken"
        assert free | self._taken == set(range(self.num_slots)), "a slot went missing"
