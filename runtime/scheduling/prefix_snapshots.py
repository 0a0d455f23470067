"""The prefix cache for plans with recurrent (slot) state: where to snapshot a request's recurrent state, how deep
a prefix hit may go, and the slot copies each step carries (runtime/state/snapshot_store.py keeps the snapshots).

Snapshot points. A chunk of a prompt of n tokens is cut at the snapshot points past its start: the end of the
prompt's last full block ((n // bs) * bs), the last block boundary before its last token (((n - 1) // bs) * bs,
the deepest hit the same prompt sent again can use: one token must remain to compute) and, with an interval of
k blocks, every k-th block boundary. When a chunk ends at one of them, the step copies the request's live slot
into a reserved snapshot slot after its forward; update() registers the snapshot under the chain hash of the
prefix once the step is applied (or frees it when the request is gone). Multi-turn chat hits: the second turn's
prompt starts with the first turn's prompt, whose last full block has a snapshot.

Hits. A KV prefix hit is cut to the deepest block whose chain hash has a snapshot (KVCache.find_prefix's
`resumable`); none: the request recomputes from position 0 (its KV blocks are still shared where cached, but a
hit of 0 blocks shares none). A hit of m blocks copies the snapshot into the request's live slot before the
step's forward. Within one step the order is: restores, forward, saves — so a snapshot evicted for a save
in the same step as a restore that reads it is read first.

Host tier. With the prefix cache's host tier (runtime/state/host_tier.py), snapshots that leave the store go to host
memory (SnapshotStore.on_spill), and a hit may resume at a depth whose snapshot is there: before the hit's KV is
adopted (`claim`: the adoption's evictions may drop host entries) the entry is taken out of the tier; once adopted
(`admitted`) it gets a snapshot slot, registered at once, into which the step's dispatch writes it before the
step's slot copies restore it into the live slot like any device snapshot. The snapshot is on the device again
for later hits. Such a slot must not be taken by another restore or a save of the same step (the save's eviction
would put the bytes back on the host and cancel the write its restore needs), nor may a host restore take a slot
the step reads: `_reads` and `_restored` keep them until the step's copies are handed out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from ..state.block_pool import block_hash
from ..state.host_tier import SNAPSHOTS, HostEntry, HostTier
from ..state.kinds import engine_slots, engine_snapshot_slots
from ..state.kv_cache import KVCache, PrefixHit
from ..state.snapshot_store import SnapshotStore
from .requests import Request
from .scheduled_step import SlotCopies, SlotCopy


def prefix_hash(token_ids: Sequence[int], num_blocks: int, block_size: int) -> bytes:
    """The chain hash of the first num_blocks full blocks of token_ids (block_pool.block_hash)."""
    parent = None
    for i in range(num_blocks):
        parent = block_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
    return parent


class SnapshotPlanner:
    def __init__(
        self,
        store: SnapshotStore,
        slot_kinds: Sequence[str],
        block_size: int,
        interval_blocks: int = 0,
        host: HostTier | None = None,
    ):
        """slot_kinds: the plan's slot state kinds, in index order (one snapshot slot index serves them all);
        interval_blocks: also snapshot every that many blocks (0: only at the prompt's last block boundaries);
        host: the prefix cache's host tier, where the store's snapshots spill (None, or one without snapshots:
        hits resume from device snapshots alone)."""
        self.store, self.slot_kinds, self.block_size = store, tuple(slot_kinds), block_size
        self.interval = interval_blocks * block_size
        self.host = host if host is not None and host.keeps_snapshots else None
        self._restores: list[SlotCopy] = []  # copies before the step being scheduled
        self._pending: dict[str, tuple[bytes, int, int]] = {}  # request id -> (prefix hash, snapshot slot, end)
        self._claimed: HostEntry | None = None  # the host snapshot of the hit being adopted
        self._reads: set[int] = set()  # snapshot slots the step being built restores from (before its forward)
        self._restored: set[int] = set()  # ... of which the host tier writes first (their copies are queued)

    # --- hits ---------------------------------------------------------------------------------------
    def resumable(self, hashes: Sequence[bytes], n: int) -> int:
        """The deepest m <= n whose prefix of m blocks has a snapshot on the device, or on the host with a snapshot
        slot to bring it back into (0: none)."""
        for m in range(n, 0, -1):
            if self.store.lookup(hashes[m - 1]) is not None or self._on_host(hashes[m - 1]):
                return m
        return 0

    def _on_host(self, chain_hash: bytes) -> bool:
        return (
            self.host is not None
            and self.host.holds(chain_hash, SNAPSHOTS)
            and self.store.can_reserve(keep=self._reads)
        )

    def claim(self, hit: PrefixHit) -> None:
        """A hit about to be adopted: take its snapshot out of the host tier if it is there, before the KV
        adoption's evictions (which may put host entries back and drop old ones) run."""
        if hit.num_blocks and self.host is not None and self.store.lookup(hit.hashes[-1]) is None:
            (self._claimed,) = self.host.take([hit.hashes[-1]], SNAPSHOTS)

    def admitted(self, request: Request, hit: PrefixHit) -> None:
        """A request admitted with `hit` (its KV adopted, its live slots allocated): restore its snapshot before
        the step, from a snapshot slot the host tier writes first when the snapshot was claimed from there."""
        if not hit.num_blocks:
            return
        if self._claimed is not None:
            slot = self.store.reserve(keep=self._reads)  # resumable saw one to be had; adoption only frees slots
            self.store.register_restored(hit.hashes[-1], slot)
            self.host.restore(slot, self._claimed, SNAPSHOTS)
            self._claimed = None
            self._restored.add(slot)
        snapshot = self.store.touch(hit.hashes[-1])
        self._reads.add(snapshot)
        self._restores += [SlotCopy(k, snapshot, request.state[kind].slot) for k, kind in enumerate(self.slot_kinds)]

    # --- chunks and saves -------------------------------------------------------------------------------
    def points(self, num_tokens: int) -> set[int]:
        bs = self.block_size
        points = {(num_tokens // bs) * bs, ((num_tokens - 1) // bs) * bs}
        if self.interval:
            points |= set(range(self.interval, num_tokens + 1, self.interval))
        return points - {0}

    def chunk_end(self, request: Request, start: int, end: int) -> int:
        """`end` cut at the first snapshot point past `start`."""
        return min([end] + [p for p in self.points(request.num_tokens) if start < p < end])

    def step_copies(self, chunks: Sequence[tuple[Request, int, int]]) -> SlotCopies:
        """The copies of the step being built: the restores of its admissions, and a save for each chunk that
        ends at a snapshot point not saved yet (while snapshot slots can be had)."""
        for _, snapshot, _ in self._pending.values():  # a step that was never applied (none should be left)
            self.store.cancel(snapshot)
        self._pending.clear()
        saves = []
        for request, _, end in chunks:
            if end not in self.points(request.num_tokens):
                continue
            chain = prefix_hash(request.all_token_ids, end // self.block_size, self.block_size)
            if self.store.lookup(chain) is not None or (snapshot := self.store.reserve(keep=self._restored)) is None:
                continue
            self._pending[request.request_id] = (chain, snapshot, end)
            saves += [SlotCopy(k, request.state[kind].slot, snapshot) for k, kind in enumerate(self.slot_kinds)]
        before, self._restores = tuple(self._restores), []
        self._reads.clear()
        self._restored.clear()
        return SlotCopies(before, tuple(saves))

    def updated(self, running: Callable[[str], Request | None]) -> None:
        """The step was applied: register the saves of requests still running past their snapshot point, free
        the rest (aborted, finished or preempted before update)."""
        for request_id, (chain, snapshot, end) in self._pending.items():
            request = running(request_id)
            if request is not None and request.num_computed_tokens >= end:
                self.store.register(chain, snapshot)
            else:
                self.store.cancel(snapshot)
        self._pending.clear()

    def check_consistency(self, kv: KVCache) -> None:
        """The store's own checks; each of its snapshots has its prefix's KV block cached on the device (a
        snapshot goes when that block does); each snapshot the host tier is to write lands in a registered slot."""
        restoring = self.host.pending_restores(SNAPSHOTS) if self.host is not None else {}
        self.store.check_consistency(restoring=restoring)
        for chain in self.store.registered:
            assert kv.primary.cached_block(chain) is not None, "a snapshot outlived its prefix's KV block"
        assert self._claimed is None, "a host snapshot was claimed and never restored"


class NoSnapshots:
    """The planner of a scheduler without recurrent-state snapshots: hits need no snapshot, chunks are not cut,
    steps copy nothing."""

    resumable = None

    def claim(self, hit: PrefixHit) -> None:
        pass

    def admitted(self, request: Request, hit: PrefixHit) -> None:
        pass

    def chunk_end(self, request: Request, start: int, end: int) -> int:
        return end

    def step_copies(self, chunks: Sequence[tuple[Request, int, int]]) -> SlotCopies:
        return SlotCopies()

    def updated(self, running: Callable[[str], Request | None]) -> None:
        pass

    def check_consistency(self, kv: KVCache) -> None:
        pass


def snapshot_planner(model, config, kv: KVCache) -> SnapshotPlanner | None:
    """An engine's planner (None: the plan has no slot kinds or the config keeps no snapshots): its snapshot slots
    follow the live ones in the slot arrays (runtime/state/kinds.py engine_slots, engine_snapshot_slots), a
    snapshot goes when the full-attention pool evicts the block of its prefix, and where the KV cache has a host tier
    that keeps snapshots, what leaves the store spills there."""
    count = engine_snapshot_slots(config) if model.slot_kinds else 0
    if not count:
        return None
    store = SnapshotStore(engine_slots(config), count)
    kv.primary.on_evict.append(store.drop)
    host = kv.host_tier if kv.host_tier is not None and kv.host_tier.keeps_snapshots else None
    if host is not None:
        store.on_spill.append(partial(host.spill, family=SNAPSHOTS))
    kinds = [k.name for k in model.slot_kinds]
    return SnapshotPlanner(store, kinds, config.block_size, config.snapshot_interval_blocks, host)
