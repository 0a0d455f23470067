"""What a request owns of KV, over every paged state kind: one block pool and one block table per kind.

Kinds (runtime/state/kinds.py): full attention keeps every block of a sequence; a sliding window of W
tokens keeps only what its window can still reach. A query at position p sees positions >= p - W + 1,
and the earliest position a running request will ever compute again is its computed count c (chunked
prefill included: a chunk starting at c needs W - 1 tokens before c). So once c - W + 1 is past a
block's last position the block is dropped from the request (one reference handed back) and its table
entry becomes RESERVED_BLOCK, which the window mask never lets a query read. Dropping happens right
after each step commits its blocks (update), so a dropped block that is full is already hashed: with no
other user it goes to its pool's LRU of cached free blocks, still findable by a later prefix hit.

Prefix hits. A hit of n blocks must give every kind what it needs to compute from position n * bs on:
the full kind all n blocks, a sliding kind the blocks covering [n * bs - W + 1, n * bs) (the rest of
its table starts as RESERVED_BLOCK). A full kind's hits are prefix-closed (n hits => any m < n hits);
a sliding kind's are not (it may hold the last blocks and have lost earlier ones), so the hit is the
longest n every kind accepts: the full kinds' longest leading run, then for each sliding kind the
largest n' <= n whose window blocks are all cached, repeated until no kind shortens it.

A model with one full kind behaves exactly as one BlockPool did.

Host tier. A cache of one full kind may have a host tier below it (runtime/state/host_tier.py): blocks its pool
evicts are copied to host memory, and a prefix continues past a block missing on the device when the tier holds
it. Such a block is HOST_BLOCK in the hit; adopting the hit gives it a fresh device block, registered at once,
whose bytes the step's dispatch copies back before the forward. A hit takes only as many host blocks as the pool
has blocks free for them, keeping one for the chunk after the hit. A hybrid plan's full kind is tiered the same way
(its recurrent-state snapshots are the snapshot planner's: `resumable` sees those on the host too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .block_pool import RESERVED_BLOCK, BlockPool, KVAllocation, block_hash
from .host_tier import HostTier
from .kinds import PagedKind

HOST_BLOCK = -1  # a hit's table entry for a block the host tier brings back (a device block is given at adopt)

Resumable = Callable[[Sequence[bytes], int], int]  # (chain hashes, n) -> the largest n' <= n to resume from
State = Mapping[str, object]  # a request's state: kind name -> its allocation (KVAllocation for paged kinds)


@dataclass(frozen=True)
class PrefixHit:
    num_blocks: int  # leading full blocks served from the cache (every kind agrees)
    hashes: tuple[bytes, ...]  # their chain hashes
    blocks: Mapping[str, tuple[int, ...]]  # per kind: num_blocks table entries (RESERVED_BLOCK: not kept;
    # HOST_BLOCK: restored from the host tier)


class KVCache:
    def __init__(
        self,
        pools: Mapping[str, BlockPool],
        windows: Mapping[str, int] | None = None,
        host_tier: HostTier | None = None,
    ):
        """pools: one per paged kind, in the plan's state index order; windows: kind -> W (0 or absent:
        full attention); host_tier: where the pool's evicted blocks go (one full kind only)."""
        if not pools:
            raise ValueError("KVCache needs at least one pool")
        sizes = {p.block_size for p in pools.values()}
        if len(sizes) != 1:
            raise ValueError(f"every KV pool must use one block size, got {sorted(sizes)}")
        self.pools = dict(pools)
        self.kinds = tuple(PagedKind(name, int((windows or {}).get(name) or 0)) for name in pools)
        self.block_size = sizes.pop()
        # counters and the engine's free-block view follow the first full kind (the one that bounds context)
        self.primary = self.pools[next((k.name for k in self.kinds if not k.window), self.kinds[0].name)]
        self.host_tier = host_tier
        if host_tier is not None:
            if len(self.kinds) != 1 or self.kinds[0].window:
                raise ValueError("the prefix cache's host tier serves a single full-attention KV kind")
            if host_tier.block_size != self.block_size:
                raise ValueError(f"host tier blocks of {host_tier.block_size} tokens, pool's of {self.block_size}")
            self.primary.on_spill.append(host_tier.spill)

    @classmethod
    def of(
        cls,
        kinds: Sequence[PagedKind],
        num_blocks: Mapping[str, int],
        block_size: int,
        host_tier: HostTier | None = None,
    ) -> KVCache:
        return cls(
            {k.name: BlockPool(num_blocks[k.name], block_size, kind=k.name) for k in kinds},
            {k.name: k.window for k in kinds},
            host_tier,
        )

    # --- sizes ----------------------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def dropped_blocks(self, kind: PagedKind, num_computed: int) -> int:
        """Leading blocks no query at a position >= num_computed can see (0 for full attention)."""
        if not kind.window:
            return 0
        return max(0, (num_computed - kind.window + 1) // self.block_size)

    def peak_blocks(self, kind: PagedKind, num_tokens: int) -> int:
        """The most blocks of `kind` a request of num_tokens context holds at once (decoding; a prefill
        chunk adapts its length to the blocks free)."""
        total = self.blocks_for(num_tokens)
        return total if not kind.window else min(total, math.ceil(kind.window / self.block_size) + 1)

    def fits_alone(self, num_tokens: int) -> bool:
        return all(self.peak_blocks(k, num_tokens) <= self.pools[k.name].num_usable_blocks for k in self.kinds)

    def has_room_for(self, num_tokens: int) -> bool:
        """Every pool has free blocks for a new request's num_tokens (the engine's bounded wait)."""
        return all(self.peak_blocks(k, num_tokens) <= self.pools[k.name].free_blocks for k in self.kinds)

    # --- per-request state ----------------------------------------------------------------------------
    def new_state(self) -> dict[str, KVAllocation]:
        return {k.name: self.pools[k.name].new_allocation() for k in self.kinds}

    def tables(self, state: State) -> tuple[tuple[int, ...], ...]:
        """One block table per kind, in kind order (a snapshot)."""
        return tuple(tuple(state[k.name].block_table) for k in self.kinds)

    def tokens_coverable(self, state: State) -> int:
        """Positions the request could cover if it took every free block of every kind."""
        return min(
            (len(state[k.name].block_table) + self.pools[k.name].free_blocks) * self.block_size for k in self.kinds
        )

    def grow(self, state: State, num_tokens: int) -> bool:
        """Every kind's table covers positions [0, num_tokens). All or nothing across kinds."""
        missing = {k.name: self.blocks_for(num_tokens) - len(state[k.name].block_table) for k in self.kinds}
        if any(n > self.pools[name].free_blocks for name, n in missing.items()):
            return False
        for name, n in missing.items():
            if n > 0:
                state[name].block_table.extend(self.pools[name].allocate(n))
        return True

    def shrink(self, state: State, num_tokens: int) -> None:
        """Hand back every kind's blocks past those covering positions [0, num_tokens): a speculative step's
        rejected drafts. Those tail blocks hold no computed block (the prefix cache commits only full blocks of
        computed tokens), so nobody else shares them."""
        keep = self.blocks_for(num_tokens)
        for k in self.kinds:
            alloc: KVAllocation = state[k.name]
            if len(alloc.block_table) > keep:
                if len(alloc.block_hashes) > keep:
                    raise RuntimeError("shrink would free a committed block")
                tail = [b for b in alloc.block_table[keep:] if b != RESERVED_BLOCK]
                del alloc.block_table[keep:]
                self.pools[k.name].free(tail)

    def commit(self, state: State, token_ids: Sequence[int], num_computed: int) -> None:
        """Register full computed blocks in the prefix cache, then drop what every window left behind."""
        for k in self.kinds:
            self.pools[k.name].commit_full_blocks(state[k.name], token_ids, num_computed)
        self.drop_out_of_window(state, num_computed)

    def drop_out_of_window(self, state: State, num_computed: int) -> None:
        for k in self.kinds:
            alloc: KVAllocation = state[k.name]
            end = min(self.dropped_blocks(k, num_computed), len(alloc.block_table))
            if end <= alloc.num_dropped:
                continue
            dropped = [b for b in alloc.block_table[alloc.num_dropped : end] if b != RESERVED_BLOCK]
            alloc.block_table[alloc.num_dropped : end] = [RESERVED_BLOCK] * (end - alloc.num_dropped)
            alloc.num_dropped = end
            self.pools[k.name].free(dropped)

    def release(self, state: State) -> None:
        """Give back every block of every kind (finish, abort, preemption)."""
        for k in self.kinds:
            if k.name in state:
                self.pools[k.name].release(state[k.name])

    # --- prefix cache -----------------------------------------------------------------------------------
    def find_prefix(self, token_ids: Sequence[int], resumable: Resumable | None = None) -> PrefixHit:
        """The longest cached prefix every kind can resume from; no side effects. Never the whole
        sequence: at least one token must remain to be computed (its logits are needed). resumable(hashes, n):
        the largest n' <= n that state outside the KV pools (recurrent snapshots) can resume from."""
        bs, full = self.block_size, [k for k in self.kinds if not k.window]
        hashes, parent = [], None
        # host restores take free blocks: they stop one short of the pool's room, so the first chunk after the hit
        # still gets a block (a hit without restores is what it was)
        tier, room, restores = self.host_tier, self.primary.free_blocks, 0
        for i in range((len(token_ids) - 1) // bs):
            parent = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            if tier is not None and (block := self.primary.cached_block(parent)) is not None:
                if self.primary.ref_count(block) == 0:  # sharing a cached free block un-frees it
                    if restores and room <= 1:
                        break
                    room -= 1
            elif tier is not None and parent in tier and room > 1:
                room, restores = room - 1, restores + 1
            elif any(self.pools[k.name].cached_block(parent) is None for k in full):
                break  # full kinds' hits are prefix-closed: nothing past a miss counts
            hashes.append(parent)
        n = len(hashes)
        while True:
            shortest = min((self._sliding_hit(k, hashes, n) for k in self.kinds if k.window), default=n)
            if resumable is not None:
                shortest = min(shortest, resumable(hashes, shortest))
            if shortest == n:
                break
            n = shortest
        blocks = {}
        for k in self.kinds:
            first = self.dropped_blocks(k, n * bs)
            cached = self.pools[k.name].cached_block
            kept = (cached(h) for h in hashes[first:n])
            blocks[k.name] = (RESERVED_BLOCK,) * first + tuple(HOST_BLOCK if b is None else b for b in kept)
        return PrefixHit(n, tuple(hashes[:n]), blocks)

    def no_hit(self) -> PrefixHit:
        return PrefixHit(0, (), {k.name: () for k in self.kinds})

    def _sliding_hit(self, kind: PagedKind, hashes: Sequence[bytes], limit: int) -> int:
        """The largest n <= limit whose window blocks [dropped_blocks(n * bs), n) are all cached."""
        cached, run, runs = self.pools[kind.name].cached_block, 0, []
        for h in hashes[:limit]:
            run = run + 1 if cached(h) is not None else 0
            runs.append(run)  # runs[i]: cached blocks in a row ending at block i
        for n in range(limit, 0, -1):
            if runs[n - 1] >= n - self.dropped_blocks(kind, n * self.block_size):
                return n
        return 0

    def tokens_coverable_after(self, hit: PrefixHit) -> int:
        """tokens_coverable of a request admitted with `hit` (sharing a cached free block un-frees it)."""
        return min(
            (
                hit.num_blocks
                + self.pools[k.name].free_blocks_after_sharing(self._real(hit, k))
                - hit.blocks[k.name].count(HOST_BLOCK)  # each restore takes a free block
            )
            * self.block_size
            for k in self.kinds
        )

    def adopt(self, state: State, hit: PrefixHit) -> int:
        """Start an empty state with a prefix hit (taking a reference to each kept block); returns the
        tokens it covers."""
        for k in self.kinds:
            alloc: KVAllocation = state[k.name]
            if alloc.block_table:
                raise ValueError("adopt needs an empty allocation")
            self.pools[k.name].share_blocks(self._real(hit, k))
            alloc.block_table = list(hit.blocks[k.name])
            restored = [i for i, b in enumerate(alloc.block_table) if b == HOST_BLOCK]
            if restored:  # after sharing, so the allocation evicts no device block of this hit
                hashes = [hit.hashes[i] for i in restored]
                data = self.host_tier.take(hashes)  # first: the allocation's evictions may drop host entries
                blocks = self.pools[k.name].allocate_registered(hashes)
                for i, block, host in zip(restored, blocks, data):
                    alloc.block_table[i] = block
                    self.host_tier.restore(block, host)
            alloc.block_hashes = list(hit.hashes)
            alloc.num_dropped = self.dropped_blocks(k, hit.num_blocks * self.block_size)
        self.primary.record_prefix_query(hit.num_blocks)
        return hit.num_blocks * self.block_size

    @staticmethod
    def _real(hit: PrefixHit, kind: PagedKind) -> list[int]:
        return [b for b in hit.blocks[kind.name] if b not in (RESERVED_BLOCK, HOST_BLOCK)]

    # --- self-check (tests, debugging) --------------------------------------------------------------
    def check_consistency(self) -> None:
        for pool in self.pools.values():
            pool.check_consistency()
        if self.host_tier is not None:
            self.host_tier.check_consistency()
            for block in self.host_tier.pending_restores():  # a restore writes a block registered for its bytes
                assert self.primary.hash_of(block) is not None, f"a host restore into unregistered block {block}"

    def all_free(self) -> bool:
        return all(p.free_blocks == p.num_usable_blocks for p in self.pools.values())
