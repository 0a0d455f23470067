"""Paged KV block pool with an automatic prefix cache, and the kinds of per-request model state.

The pool hands out blocks of `block_size` token slots; a token at position p of a sequence lives in
slot `block_table[p // block_size] * block_size + p % block_size` of the plan's KV arrays
[layers, num_blocks, block_size, hkv, dh]. Block 0 is reserved for the plans' padding writes and is
never handed out, so `num_blocks - 1` blocks are usable.

Prefix cache. A block that is full and whose KV is computed is registered under a hash chain of the
token ids it holds: h_i = blake2b(h_{i-1} || tokens of block i), so equal hashes mean equal whole
prefixes, not just equal blocks. A later request whose prompt starts with those blocks shares them
(ref-counted) and computes only the rest. Sharing is safe without copying: only full, computed blocks
are ever registered, and a request writes only at positions >= its computed count, which lie past
every shared block — the one partially filled block a request writes is always its own (copy-on-write
at the boundary, without the copy). When a block's last user lets go, a registered block goes to an
LRU "cached free" list — still findable by a later prefix — and is evicted (its hash forgotten) only
when an allocation finds the plain free list empty.

One pool serves one state kind (see runtime/state/kv_cache.py: full attention, or a sliding window): a
sliding kind's allocations hold RESERVED_BLOCK where a block fell out of the window and was handed back;
those entries are neither committed nor released here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

RESERVED_BLOCK = 0  # padding rows of every plan write here; no sequence ever owns or reads it


class NoFreeBlocksError(RuntimeError):
    pass


def block_hash(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    """Chain hash of one full block: stable across processes (Python's hash() is salted per process)."""
    h = hashlib.blake2b(digest_size=16, person=b"ember-kv-block")
    h.update(b"P" + parent if parent is not None else b"R")  # parent is fixed-size, so no ambiguity
    h.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return h.digest()


@dataclass(frozen=True)
class KVCounters:
    allocations: int  # blocks handed out by allocate()
    evictions: int  # cached blocks dropped from the prefix cache to make room for an allocation
    prefix_queries: int  # match_prefix calls (admissions)
    prefix_hits: int  # ... of which got >= 1 cached block
    reused_tokens: int  # tokens served from the cache over all hits


@dataclass(eq=False)
class KVAllocation:
    """The KV blocks one request owns of one state kind: its block table (RESERVED_BLOCK where a sliding kind
    dropped a block), and the chain hashes of its leading full, computed blocks."""

    kind: str = "kv"
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # one per leading full, computed block
    num_dropped: int = 0  # leading table entries handed back (sliding kinds): RESERVED_BLOCK from here on


class StateAllocation(Protocol):
    """What a request owns of one kind of model state (see runtime/state/kinds.py StateKind)."""

    kind: str


class StateAllocator(Protocol):
    """Hands out one kind of per-request state. BlockPool is the allocator of kind "kv"; a model with
    recurrent layers adds an allocator of fixed-size state slots (one per running request)."""

    kind: str
    # False when a prefix-cache hit would skip computing this state (recurrent state): the scheduler then
    # matches prefixes only through recurrent-state snapshots (runtime/scheduling/prefix_snapshots.py), if any.
    supports_prefix_reuse: bool

    def can_allocate(self) -> bool: ...

    def new_allocation(self) -> StateAllocation: ...

    def release(self, allocation: Any) -> None: ...


class BlockPool:
    supports_prefix_reuse = True

    def __init__(self, num_blocks: int, block_size: int = 16, kind: str = "kv"):
        self.kind = kind  # the state kind whose KV this pool holds
        if num_blocks < 2:
            raise ValueError(f"a KV pool needs >= 2 blocks (block 0 is reserved), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))  # ref 0, not in the prefix cache
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # ref 0, in the cache; oldest first
        self._block_of_hash: dict[bytes, int] = {}
        self._hash_of_block: dict[int, bytes] = {}
        self._allocations = self._evictions = 0
        self._prefix_queries = self._prefix_hits = self._reused_tokens = 0
        # called with the chain hash of each block evicted from the prefix cache (state kept per cached prefix,
        # e.g. recurrent snapshots in runtime/state/snapshot_store.py, goes with it)
        self.on_evict: list[Callable[[bytes], None]] = []
        # called with (chain hash, block) of each evicted block before its reuse, while it still holds the KV (the
        # prefix cache's host tier, runtime/state/host_tier.py, copies it out)
        self.on_spill: list[Callable[[bytes, int], None]] = []

    # --- capacity ----------------------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can get now: plain free + cached free (evictable)."""
        return len(self._free) + len(self._cached_free)

    @property
    def cached_free_blocks(self) -> int:
        return len(self._cached_free)

    @property
    def used_blocks(self) -> int:
        return self.num_usable_blocks - self.free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def hash_of(self, block: int) -> bytes | None:
        """The chain hash a block is registered under in the prefix cache, None if it is not."""
        return self._hash_of_block.get(block)

    def counters(self) -> KVCounters:
        return KVCounters(
            self._allocations, self._evictions, self._prefix_queries, self._prefix_hits, self._reused_tokens
        )

    # --- raw blocks ---------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """n fresh blocks (ref count 1), evicting least recently used cached blocks if the free list is short."""
        if n > self.free_blocks:
            raise NoFreeBlocksError(f"asked for {n} KV blocks, {self.free_blocks} free")
        blocks = []
        for _ in range(n):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._cached_free.popitem(last=False)
                evicted = self._hash_of_block.pop(block)
                del self._block_of_hash[evicted]
                self._evictions += 1
                for spill in self.on_spill:
                    spill(evicted, block)
                for hook in self.on_evict:
                    hook(evicted)
            self._ref[block] = 1
            blocks.append(block)
        self._allocations += n
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block. Given a block table, frees its tail first, so the LRU evicts
        the ends of cached chains before their heads (a head is worth more: every longer prefix needs it)."""
        for block in reversed(list(blocks)):
            if self._ref[block] <= 0:
                raise RuntimeError(f"KV block {block} freed more often than it was taken")
            self._ref[block] -= 1
            if self._ref[block] == 0:
                if block in self._hash_of_block:
                    self._cached_free[block] = None  # most recently used end
                else:
                    self._free.append(block)

    def _share(self, block: int) -> None:
        if self._ref[block] == 0:
            del self._cached_free[block]
        self._ref[block] += 1

    # --- prefix cache -------------------------------------------------------------------------------
    def find_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """The cached blocks holding the longest run of full leading blocks of token_ids; no side effects.
        Never the whole sequence: at least one token must remain to be computed (its logits are needed)."""
        bs = self.block_size
        blocks, parent = [], None
        for i in range((len(token_ids) - 1) // bs):
            parent = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            block = self._block_of_hash.get(parent)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def match_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """find_prefix, then take a reference to each block found (the caller now shares them)."""
        blocks = self.find_prefix(token_ids)
        self.share_blocks(blocks)
        self.record_prefix_query(len(blocks))
        return blocks

    def cached_block(self, chain_hash: bytes) -> int | None:
        """The block registered under a chain hash, None if none is (or it was evicted)."""
        return self._block_of_hash.get(chain_hash)

    def share_blocks(self, blocks: Iterable[int]) -> None:
        """Take one reference to each (cached) block: a prefix hit now shares it."""
        for block in blocks:
            self._share(block)

    def allocate_registered(self, chain_hashes: Sequence[bytes]) -> list[int]:
        """One fresh block per hash (ref count 1), each registered in the prefix cache under it at once: blocks
        whose KV a copy from the host tier writes before any step reads them."""
        if any(h in self._block_of_hash for h in chain_hashes):
            raise ValueError("a chain hash is already cached on the device")
        blocks = self.allocate(len(chain_hashes))
        for block, chain_hash in zip(blocks, chain_hashes):
            self._block_of_hash[chain_hash] = block
            self._hash_of_block[block] = chain_hash
        return blocks

    def record_prefix_query(self, num_blocks: int) -> None:
        """Count one admission's prefix lookup that reused num_blocks blocks (the counters in counters())."""
        self._prefix_queries += 1
        if num_blocks:
            self._prefix_hits += 1
            self._reused_tokens += num_blocks * self.block_size

    def free_blocks_after_sharing(self, blocks: Sequence[int]) -> int:
        """free_blocks once `blocks` (from find_prefix) are taken: sharing a cached-free block un-frees it."""
        return self.free_blocks - sum(1 for b in blocks if self._ref[b] == 0)

    def commit_full_blocks(self, alloc: KVAllocation, token_ids: Sequence[int], num_computed: int) -> int:
        """Register the allocation's blocks that are now full and computed (the first num_computed of
        token_ids have their KV in the pool). Returns how many blocks were newly registered. A block whose
        hash is already cached under another block (two equal prompts prefilled side by side) stays
        private and is simply not registered; the chain still continues through its hash."""
        if num_computed > len(token_ids):
            raise ValueError(f"{num_computed} computed tokens but only {len(token_ids)} token ids")
        bs = self.block_size
        registered = 0
        full = min(num_computed // bs, len(alloc.block_table))
        for i in range(len(alloc.block_hashes), full):
            parent = alloc.block_hashes[-1] if alloc.block_hashes else None
            h = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            alloc.block_hashes.append(h)
            block = alloc.block_table[i]
            if block != RESERVED_BLOCK and h not in self._block_of_hash and block not in self._hash_of_block:
                self._block_of_hash[h] = block
                self._hash_of_block[block] = h
                registered += 1
        return registered

    # --- per-request allocations (the StateAllocator interface, plus KV growth) ---------------------
    def can_allocate(self) -> bool:
        return True  # KV grows on demand per chunk/token; the scheduler checks capacity as it grows

    def new_allocation(self) -> KVAllocation:
        return KVAllocation(self.kind)

    def adopt_prefix(self, alloc: KVAllocation, token_ids: Sequence[int]) -> int:
        """Start an empty allocation with the cached prefix of token_ids; returns the tokens it covers."""
        if alloc.block_table:
            raise ValueError("adopt_prefix needs an empty allocation")
        alloc.block_table = self.match_prefix(token_ids)
        alloc.block_hashes = [self._hash_of_block[b] for b in alloc.block_table]
        return len(alloc.block_table) * self.block_size

    def tokens_coverable(self, alloc: KVAllocation) -> int:
        """How many token positions the allocation could cover if it took every free block."""
        return (len(alloc.block_table) + self.free_blocks) * self.block_size

    def grow(self, alloc: KVAllocation, num_tokens: int) -> bool:
        """Make the block table cover positions [0, num_tokens). All or nothing: False (and no change)
        when the free blocks do not suffice."""
        missing = self.blocks_for(num_tokens) - len(alloc.block_table)
        if missing <= 0:
            return True
        if missing > self.free_blocks:
            return False
        alloc.block_table.extend(self.allocate(missing))
        return True

    def release(self, alloc: KVAllocation) -> None:
        """Give back every block of the allocation (registered ones stay findable until evicted)."""
        self.free(b for b in alloc.block_table if b != RESERVED_BLOCK)
        alloc.block_table = []
        alloc.block_hashes = []
        alloc.num_dropped = 0

    # --- self-check (tests, debugging) --------------------------------------------------------------
    def check_consistency(self) -> None:
        """Raise AssertionError unless every usable block is exactly one of: plain free, cached free, in use."""
        free, cached = set(self._free), set(self._cached_free)
        assert len(free) == len(self._free), "a block is twice in the free list"
        assert self._ref[RESERVED_BLOCK] == 0 and RESERVED_BLOCK not in free | cached | set(self._hash_of_block)
        assert not free & cached, "a block is both free and cached-free"
        for block in range(1, self.num_blocks):
            ref = self._ref[block]
            assert ref >= 0, f"block {block} has ref count {ref}"
            if ref == 0:
                assert (block in free) != (block in cached), f"unreferenced block {block} is lost"
                assert (block in cached) == (block in self._hash_of_block), f"cached-free block {block} unhashed"
            else:
                assert block not in free and block not in cached, f"block {block} in use and free"
        assert len(self._block_of_hash) == len(self._hash_of_block)
        for h, block in self._block_of_hash.items():
            assert self._hash_of_block[block] == h, f"hash maps disagree on block {block}"
