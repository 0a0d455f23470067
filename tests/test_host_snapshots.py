"""Recurrent-state snapshots in the prefix cache's host tier (runtime/state/host_tier.py family SNAPSHOTS,
runtime/scheduling/prefix_snapshots.py) over a simulated device: test_prefix_snapshots.py's mock, whose recurrent
state is the list of tokens each slot ran through, and test_host_tier.py's numpy KV pool. Each step first runs the
tier's dispatch (as StepExecutor.launch does), then the slot restores, the forward and the saves, so a snapshot that
comes back from the host holding anything but the tokens before its request's chunk, a host restore into a slot
another copy of the step needs, or KV read back wrong fails the mock. The bookkeeping: one byte budget and LRU for
blocks and snapshots, an entry handed out once, the store's spills and pins, and requests aborted between a step's
scheduling and its copies (which ran or never ran) leaking nothing."""

from __future__ import annotations

import random
from functools import partial

import numpy as np
import pytest
from scheduler_support import slot_scheduler, soak
from test_host_tier import NumpyCopier
from test_prefix_snapshots import SnapshotMock
from test_scheduler import STOP, check_invariants, generate_alone, prompt_of, request
from test_scheduler_slots import KIND

from ember.runtime.scheduling.prefix_snapshots import SnapshotPlanner, prefix_hash
from ember.runtime.scheduling.requests import Request
from ember.runtime.state.block_pool import BlockPool
from ember.runtime.state.host_tier import BLOCKS, SNAPSHOTS, HostEntry, HostTier, _Piece
from ember.runtime.state.slot_pool import SlotPool
from ember.runtime.state.snapshot_store import SnapshotStore

BS = 4
WIDTH = 96  # a host snapshot row: a slot's tokens, then -1s (no context here is longer)
SNAPSHOT_BYTES = WIDTH * 8
BLOCK_BYTES = BS * 8  # test_host_tier's NumpyCopier: a block is BS int64 token values


class StateCopier:
    """The snapshot copier over the mock's recurrent state ({slot: tokens}): a gather gives rows [n, WIDTH] of
    each slot's tokens padded with -1, in pieces of at most 2; counts its calls."""

    def __init__(self):
        self.gathers = self.scatters = 0

    def gather(self, device, slots):
        self.gathers += 1
        rows = np.full((len(slots), WIDTH), -1, np.int64)
        for row, slot in zip(rows, slots):
            tokens = device.state.get(slot, [])
            row[: len(tokens)] = tokens
        return [rows[i : i + 2].copy() for i in range(0, len(slots), 2)]

    def scatter(self, device, slots, entries):
        self.scatters += 1
        for slot, entry in zip(slots, entries):
            row = entry.data()
            device.state[slot] = row[: int(np.argmax(row < 0)) if (row < 0).any() else WIDTH].tolist()
        return device

    def take_rows(self, array, rows):
        return array[np.asarray(rows)].copy()


class KVCopier(NumpyCopier):
    """test_host_tier's block copier over the mock's shadow KV pool (the same "device" as StateCopier's)."""

    def gather(self, device, blocks):
        return super().gather(device.shadow["kv"].reshape(-1, BS), blocks)

    def scatter(self, device, blocks, entries):
        super().scatter(device.shadow["kv"].reshape(-1, BS), blocks, entries)
        return device


class HostMock(SnapshotMock):
    """SnapshotMock with the tier's copies dispatched before each step (launch's order)."""

    def __init__(self, scheduler, slots, tier):
        super().__init__(scheduler, slots)
        self.tier, self.kv_copier, self.state_copier = tier, KVCopier(), StateCopier()

    def dispatch(self):
        assert self.tier.dispatch(self, self.kv_copier, self.state_copier) is self

    def run(self, plan):
        self.dispatch()
        return super().run(plan)


def make(num_blocks=60, snapshots=2, host_blocks=64, host_snapshots=8, interval=0, **kw):
    tier = HostTier(host_blocks * BLOCK_BYTES + host_snapshots * SNAPSHOT_BYTES, BLOCK_BYTES, BS, SNAPSHOT_BYTES)
    pool, slots = BlockPool(num_blocks, BS), SlotPool(kw.pop("num_slots", 8), KIND)
    store = SnapshotStore(slots.num_slots, snapshots)
    pool.on_evict.append(store.drop)
    store.on_spill.append(partial(tier.spill, family=SNAPSHOTS))
    planner = SnapshotPlanner(store, [KIND], BS, interval, host=tier)
    s = slot_scheduler(pool, slots, {**kw, "host_tier": tier}, snapshots=planner)
    return s, HostMock(s, slots, tier), planner


def check(s, planner) -> None:
    check_invariants(s)  # the KV cache's consistency, the host tier's with it
    planner.check_consistency(s.kv)
    s.extra_state[KIND].check_consistency()


def run_one(s, mock, planner, req, checked=True) -> tuple[list[int], list[int]]:
    """Run `req` alone to its end: (its tokens, the start of each of its chunks)."""
    s.add(req)
    tokens, starts = [], []
    while s.has_work:
        plan = s.schedule()
        starts += [c.start for c in plan.prefills if c.request_id == req.request_id]
        for out in s.update(plan, mock.run(plan)):
            tokens += out.new_token_ids
        if checked:
            check(s, planner)
    return tokens, starts


def test_a_snapshot_evicted_by_a_save_comes_back_from_the_host():
    s, mock, planner = make(snapshots=1)
    tier, store = mock.tier, planner.store
    prompt, other = prompt_of(10, 1), prompt_of(10, 2)  # one snapshot point each: 8
    cold, _ = run_one(s, mock, planner, request("a", prompt, max_tokens=4, stop=()))
    run_one(s, mock, planner, request("b", other, max_tokens=2, stop=()))  # its save evicts a's snapshot
    chain = prefix_hash(prompt, 2, BS)
    assert store.lookup(chain) is None and tier.holds(chain, SNAPSHOTS)
    warm, starts = run_one(s, mock, planner, req := request("c", prompt, max_tokens=4, stop=()))
    assert warm == cold == generate_alone(prompt, 4, stop=())
    assert starts == [8] and req.cached_tokens == 8
    # back on the device (it took b's slot, whose snapshot went to the host), and handed out once
    assert store.lookup(chain) is not None and not tier.holds(chain, SNAPSHOTS)
    assert tier.holds(prefix_hash(other, 2, BS), SNAPSHOTS)
    counters = tier.counters()
    assert (counters.offloaded_snapshots, counters.restored_snapshots) == (2, 1)
    assert counters.snapshot_bytes == SNAPSHOT_BYTES and counters.restored_bytes == SNAPSHOT_BYTES
    assert counters.restored_blocks == 0  # its KV stayed on the device
    assert mock.state_copier.scatters == 1 and not tier.has_pending


def test_a_snapshot_goes_to_the_host_with_its_kv_blocks_and_both_come_back():
    s, mock, planner = make(num_blocks=12, snapshots=4)
    tier, store = mock.tier, planner.store
    prompt = prompt_of(22, 3)  # points 20: 5 blocks and a snapshot
    cold, _ = run_one(s, mock, planner, request("a", prompt, max_tokens=3, stop=()))
    run_one(s, mock, planner, request("big", prompt_of(40, 4), max_tokens=2, stop=()))  # takes every block
    chain = prefix_hash(prompt, 5, BS)
    assert store.lookup(chain) is None and tier.holds(chain, SNAPSHOTS) and chain in tier  # dropped, not lost
    warm, starts = run_one(s, mock, planner, req := request("b", prompt, max_tokens=3, stop=()))
    assert warm == cold and starts == [20] and req.cached_tokens == 20
    counters = tier.counters()
    assert counters.restored_snapshots == 1 and counters.restored_blocks >= 5
    assert counters.offloaded_bytes == counters.offloaded_blocks * BLOCK_BYTES + counters.offloaded_snapshots * (
        SNAPSHOT_BYTES
    )


def test_a_host_snapshot_needs_a_slot_the_step_does_not_read():
    """One snapshot slot: two admissions that could share a step, the first resuming from the device snapshot,
    the second's on the host. Bringing it back would overwrite the slot the first restores from: the second is not
    resumable in that step (its chunk from 0 stops at a snapshot point, so it waits) and resumes from the host in
    the next."""
    s, mock, planner = make(snapshots=1, segments=(1, 2), budget=32)
    p, q = prompt_of(10, 5), prompt_of(10, 6)
    run_one(s, mock, planner, request("p", p, max_tokens=1, stop=()))
    run_one(s, mock, planner, request("q", q, max_tokens=1, stop=()))  # p's snapshot to the host, q's on the device
    s.add(a := request("a", q, max_tokens=2, stop=()))
    s.add(b := request("b", p, max_tokens=2, stop=()))
    plan = s.schedule()
    assert [c.request_id for c in plan.prefills] == ["a"] and a.cached_tokens == 8
    s.update(plan, mock.run(plan))
    while s.has_work:
        plan = s.schedule()
        s.update(plan, mock.run(plan))
        check(s, planner)
    assert b.cached_tokens == 8 and mock.tier.counters().restored_snapshots == 1
    assert a.output_token_ids == generate_alone(q, 2, stop=()) and b.output_token_ids == generate_alone(p, 2, stop=())


@pytest.mark.parametrize("dispatched", [True, False], ids=["copies_ran", "step_never_ran"])
def test_requests_aborted_mid_restore_leak_nothing(dispatched):
    """A request admitted with its KV blocks and its snapshot on the host is aborted after its step is scheduled:
    the step's copies run (their bytes land in places still registered) or never run (the places are spilled from
    the host bytes at hand when evicted). Either way no block, slot, snapshot slot or host entry is lost, and the
    prompt still comes back whole."""
    s, mock, planner = make(num_blocks=12, snapshots=1)
    tier, store = mock.tier, planner.store
    prompt = prompt_of(22, 7)
    cold, _ = run_one(s, mock, planner, request("a", prompt, max_tokens=3, stop=()))
    run_one(s, mock, planner, request("big", prompt_of(40, 8), max_tokens=2, stop=()))
    s.add(request("b", prompt, max_tokens=3, stop=()))
    plan = s.schedule()
    assert plan.prefills[0].start == 20 and tier.has_pending  # restores queued: 5 blocks and the snapshot
    assert set(tier.pending_restores(SNAPSHOTS)) == {store.lookup(prefix_hash(prompt, 5, BS))}
    assert s.abort("b")
    check(s, planner)
    if dispatched:
        mock.dispatch()  # the launch ran the copies; the forward's results are dropped
    s.update(plan, [0] * len(plan.logit_request_ids))
    check(s, planner)
    assert s.kv.all_free() and s.extra_state[KIND].all_free() and store.all_free()
    # push everything out again: restored places go back to the host (gathered, or from the bytes at hand)
    run_one(s, mock, planner, request("big2", prompt_of(40, 9), max_tokens=2, stop=()))
    counters = tier.counters()
    assert len(tier) == counters.offloaded_blocks + counters.offloaded_snapshots - counters.restored_blocks - (
        counters.restored_snapshots + counters.dropped_blocks + counters.dropped_snapshots
    )
    warm, starts = run_one(s, mock, planner, req := request("c", prompt, max_tokens=3, stop=()))
    assert warm == cold and starts == [20] and req.cached_tokens == 20
    assert tier.counters().restored_snapshots == 2 and not tier.has_pending


def test_a_hit_takes_its_host_snapshot_before_its_kv_adoption_can_drop_it():
    """The adoption of a hit's host KV blocks may evict a block whose restore (and whose snapshot's restore) never
    ran; their bytes go back into the full host LRU and drop its oldest entry, the hit's own snapshot: it was taken
    out first (SnapshotPlanner.claim)."""
    s, mock, planner = make(num_blocks=5, snapshots=2, host_blocks=1, host_snapshots=1)
    tier, store, pool = mock.tier, planner.store, s.kv.primary
    prompt, other = prompt_of(BS + 1, 1), prompt_of(BS + 1, 2)  # one block and a token: a snapshot after the block
    mine, theirs = prefix_hash(prompt, 1, BS), prefix_hash(other, 1, BS)
    tier._put((SNAPSHOTS, mine), snapshot_entry(prompt[:BS]))  # the oldest entry
    tier._put((BLOCKS, mine), block_entry(prompt[:BS]))  # the tier is full
    (pending,) = pool.allocate_registered([theirs])  # a hit whose step never ran: its block and snapshot queued
    tier.restore(pending, block_entry(other[:BS]))
    slot = store.reserve()
    store.register_restored(theirs, slot)
    tier.restore(slot, snapshot_entry(other[:BS]), SNAPSHOTS)
    pool.free([pending])
    (newer,) = pool.allocate_registered([prefix_hash(prompt_of(BS, 3), 1, BS)])
    pool.free([newer])  # cached free after `pending`: the LRU evicts `pending` first
    holder = s.kv.new_state()
    assert s.kv.grow(holder, 2 * BS)  # the rest of the pool: room for one restore and the chunk after it
    # (checked once the holder, which no request owns, lets go)
    tokens, starts = run_one(s, mock, planner, req := request("a", prompt, max_tokens=2, stop=()), checked=False)
    assert tokens == generate_alone(prompt, 2, stop=()) and starts == [BS] and req.cached_tokens == BS
    assert tier.holds(theirs, SNAPSHOTS)  # back from the bytes at hand (its block too, since dropped for a spill)
    s.kv.release(holder)
    check(s, planner)


def block_entry(tokens) -> HostEntry:
    """A host block holding these token values (as KVCopier's gather leaves it)."""
    return HostEntry(_Piece(np.asarray(tokens, np.int64)[None, None, None]), 0)


def snapshot_entry(tokens) -> HostEntry:
    """A host snapshot of a slot that ran through these tokens (as StateCopier's gather leaves it)."""
    row = np.full((1, WIDTH), -1, np.int64)
    row[0, : len(tokens)] = tokens
    return HostEntry(_Piece(row), 0)


def test_blocks_and_snapshots_share_one_byte_budget_and_lru():
    tier = HostTier(4 * BLOCK_BYTES + SNAPSHOT_BYTES, BLOCK_BYTES, BS, SNAPSHOT_BYTES)
    hashes = [bytes([i]) * 16 for i in range(12)]

    def put(family, i, width):
        tier._put((family, hashes[i]), HostEntry(_Piece(np.zeros((1, width), np.int64)), 0))

    for i in range(4):
        put(BLOCKS, i, BS)
    put(SNAPSHOTS, 4, WIDTH)
    assert tier.used_bytes == tier.capacity_bytes and len(tier) == 5
    put(SNAPSHOTS, 5, WIDTH)  # a second snapshot: the oldest entries go until it fits, the first snapshot too
    assert not tier.holds(hashes[4], SNAPSHOTS) and tier.holds(hashes[5], SNAPSHOTS) and len(tier) == 1
    for i in range(6, 10):  # four blocks fit beside it; a fifth pushes it out
        put(BLOCKS, i, BS)
    assert tier.holds(hashes[5], SNAPSHOTS) and len(tier) == 5
    put(BLOCKS, 10, BS)
    assert not tier.holds(hashes[5], SNAPSHOTS) and len(tier) == 5
    counters = tier.counters()
    assert (counters.dropped_blocks, counters.dropped_snapshots) == (4, 2) and counters.snapshot_bytes == 0
    tier.check_consistency()
    (entry,) = tier.take([hashes[10]])
    with pytest.raises(KeyError):  # an entry is handed out once
        tier.take([hashes[10]])
    tier.restore(3, entry)
    tier.check_consistency()
    tier._put((BLOCKS, hashes[11]), entry)  # the same host row held and queued: caught
    with pytest.raises(AssertionError, match="handed out twice"):
        tier.check_consistency()
    small = HostTier(SNAPSHOT_BYTES - 1, BLOCK_BYTES, BS, SNAPSHOT_BYTES)
    small.spill(hashes[0], 9, SNAPSHOTS)  # a snapshot the budget cannot hold is not queued
    assert not small.has_pending and small.capacity_of(SNAPSHOTS) == 0


def test_the_store_spills_what_leaves_it_and_keeps_what_a_step_needs():
    store, spilled = SnapshotStore(4, 2), []
    store.on_spill.append(lambda chain, slot: spilled.append((chain, slot)))
    a, b = store.reserve(), store.reserve()
    store.register(b"a", a)
    store.register(b"b", b)
    assert not store.can_reserve(keep={a, b}) and store.reserve(keep={a, b}) is None
    assert store.reserve(keep={a}) == b and spilled == [(b"b", b)]  # the LRU one not kept
    store.register_restored(b"c", b)  # a host snapshot brought back into the reserved slot
    with pytest.raises(ValueError):
        store.register_restored(b"c", b)
    store.drop(b"a")
    assert spilled[-1] == (b"a", a) and store.lookup(b"c") == b
    store.check_consistency(restoring=[b])
    with pytest.raises(AssertionError, match="not registered"):
        store.check_consistency(restoring=[a])


@pytest.mark.parametrize("segments", [(1,), (1, 2)], ids=["one_chunk", "segments"])
def test_soak_with_host_snapshots_aborts_and_preemptions(segments):
    """test_prefix_snapshots' soak over a KV pool, snapshot slots and a host tier all too small for the load, and
    steps whose requests are all aborted after scheduling (their copies run, or the step never runs): every
    request's tokens are its run alone's, the store and tier stay consistent after every step, and everything comes
    back."""
    rng = random.Random(11)
    s, mock, planner = make(num_blocks=26, snapshots=2, host_blocks=24, host_snapshots=4, interval=2, segments=segments)
    tier, aborted_steps = mock.tier, set()
    run = mock.run

    def run_or_abort(plan):
        if plan.logit_request_ids and rng.random() < 0.05:  # every request of the step aborted before its launch
            ids = {r.request_id for r in plan.decodes} | {c.request_id for c in plan.prefills}
            for rid in ids:
                assert s.abort(rid)
            aborted_steps.update(ids)
            if rng.random() < 0.5:
                mock.dispatch()  # launched: its copies ran
            return [0] * len(plan.logit_request_ids)
        return run(plan)

    mock.run = run_or_abort
    bases = [prompt_of(rng.randint(8, 30), 700 + i) for i in range(5)]
    pending = []
    for i in range(250):
        prompt = rng.choice(bases)[: rng.randint(1, 30)] + prompt_of(rng.randint(0, 10), 2000 + i)
        pending.append(Request(f"q{i}", prompt or [1], rng.randint(1, 16), frozenset({STOP})))
    specs = {r.request_id: (list(r.prompt_token_ids), r.max_tokens) for r in pending}

    def step_check(s):
        check(s, planner)
        assert planner.store.all_free()

    res = soak(s, mock, pending, rng, step_check, max_steps=20_000)
    assert set(res.finished) | res.aborted | aborted_steps == set(specs)
    for rid, (prompt, max_tokens) in specs.items():
        expected = generate_alone(prompt, max_tokens)
        assert res.streamed[rid] == (expected if rid in res.finished else expected[: len(res.streamed[rid])]), rid
    mock.dispatch()
    check(s, planner)
    assert s.kv.all_free() and mock.slots.all_free() and not tier.has_pending
    counters = tier.counters()
    assert counters.restored_snapshots > 10 and counters.restored_blocks > 5, counters
    assert counters.dropped_snapshots > 0 and counters.dropped_blocks > 0 and aborted_steps, counters
    assert s.snapshot().preemptions > 3


@pytest.mark.parametrize("count", [1, 3])
def test_the_jax_snapshot_copier_moves_every_slot_layer_bit_for_bit(count, monkeypatch):
    """Snapshot slots of slot layers whose arrays differ in shape and dtype (float32 with a NaN payload and -0.0,
    bfloat16, int8) go out as rows of bytes in pinned host memory and come back into other slots bit for bit;
    paged and stateless layers are left alone; rows of a piece not restored are written nowhere."""
    import jax
    import jax.numpy as jnp

    from ember.runtime.execution import block_copies
    from ember.runtime.execution.snapshot_copies import SnapshotCopier

    monkeypatch.setattr(block_copies, "PIECE", 2)  # 3 snapshots go as pieces of 2 and 1
    rng = np.random.default_rng(count)
    conv = rng.standard_normal((6, 3, 5)).astype(np.float32)
    conv[1, 0, 0], conv[4, 2, 1] = np.float32(-0.0), np.uint32(0x7FC0_1234).view(np.float32)  # -0, a NaN payload
    layers = [
        (conv, rng.standard_normal((6, 2, 4, 4)).astype(np.float32)),
        (rng.standard_normal((6, 7)).astype(jnp.bfloat16), rng.integers(-128, 127, (6, 3)).astype(np.int8)),
    ]
    paged = (jnp.zeros((4, BS, 1, 2)), jnp.ones((4, BS, 1, 2)))
    kv = [tuple(jnp.asarray(a) for a in layers[0]), paged, tuple(jnp.asarray(a) for a in layers[1]), ()]
    copier = SnapshotCopier(layers=(0, 2))
    slots = [4, 1, 5][:count]
    pieces = [_Piece(a) for a in copier.gather(kv, slots)]
    assert [p.rows for p in pieces] == block_copies._pieces(count)
    assert all(p.array.sharding.memory_kind == "pinned_host" and p.array.dtype == np.uint8 for p in pieces)
    host = np.concatenate([p.host() for p in pieces])
    for row, slot in zip(host, slots):  # every array's bytes of the slot, end to end in layer order
        assert row.tobytes() == b"".join(a[slot].tobytes() for layer in layers for a in layer)
    entries = [HostEntry(p, i) for p in pieces for i in range(p.rows)]
    order, targets = ([0], [2]) if count == 1 else ([2, 0], [0, 3])  # 3: two of them, out of gather order
    moved = copier.scatter(kv, targets, [entries[i] for i in order])
    assert moved[1] is paged and moved[3] == ()
    for layer, arrays in zip((0, 2), layers):
        for got, want in zip(moved[layer], arrays):
            want = want.copy()
            want[targets] = want[[slots[i] for i in order]]
            assert np.asarray(got).tobytes() == want.tobytes()
    copier.precompile(jax.device_put(moved, jax.devices()[0]), max_snapshots=count)  # its shapes lower and compile
