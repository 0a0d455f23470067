"""The prefix cache of plans with a recurrent (slot) state kind, against test_scheduler_slots.py's mock plan whose
shadow recurrent state is the list of tokens each slot has run through. Snapshot copies are applied the way the
device applies them (restores before the step, saves after it), so a restored slot that does not hold exactly
the tokens before the chunk's start, a snapshot saved at the wrong point, or one reused while still needed fails."""

from __future__ import annotations

import random

import pytest
from scheduler_support import slot_scheduler, soak
from test_scheduler import STOP, check_invariants, generate_alone, prompt_of, request
from test_scheduler_slots import KIND, RecurrentMock

from ember.runtime.scheduling.prefix_snapshots import SnapshotPlanner, prefix_hash
from ember.runtime.scheduling.requests import Request
from ember.runtime.scheduling.scheduled_step import ScheduledStep
from ember.runtime.scheduling.scheduler import Scheduler
from ember.runtime.state.block_pool import BlockPool
from ember.runtime.state.slot_pool import SlotPool
from ember.runtime.state.snapshot_store import SnapshotStore

BS = 4


class SnapshotMock(RecurrentMock):
    def run(self, plan: ScheduledStep) -> list[int]:
        self._copy(plan.slot_copies.before)
        sampled = super().run(plan)
        self._copy(plan.slot_copies.after)
        return sampled

    def _copy(self, copies) -> None:
        for c in copies:
            assert c.kind == 0
            if c.dst < self.slots.num_slots:  # a restore: from a snapshot into a live slot
                assert c.src >= self.slots.num_slots
            self.state[c.dst] = list(self.state[c.src])


def make(num_slots=8, snapshots=8, interval=0, **kw):
    pool = BlockPool(kw.pop("num_blocks", 60), BS)
    slots = SlotPool(num_slots, KIND)
    store = SnapshotStore(num_slots, snapshots)
    pool.on_evict.append(store.drop)
    s = slot_scheduler(pool, slots, kw, snapshots=SnapshotPlanner(store, [KIND], BS, interval))
    return s, SnapshotMock(s, slots), store


def run_one(s, mock, req) -> tuple[list[int], list[int]]:
    """Run `req` alone to its end: (its tokens, the start of each of its chunks)."""
    s.add(req)
    tokens, starts = [], []
    while s.has_work:
        plan = s.schedule()
        starts += [c.start for c in plan.prefills if c.request_id == req.request_id]
        for out in s.update(plan, mock.run(plan)):
            tokens += out.new_token_ids
        check_invariants(s)
    return tokens, starts


def check_store(s: Scheduler, store: SnapshotStore) -> None:
    store.check_consistency()
    for chain in store.registered:  # a snapshot lives only while its prefix's KV is cached
        assert s.kv.primary.cached_block(chain) is not None


def test_the_same_prompt_again_resumes_from_its_snapshot():
    s, mock, store = make()
    prompt = prompt_of(24, 1)
    cold, starts = run_one(s, mock, request("a", prompt, max_tokens=5, stop=()))
    assert starts == [0, 16, 20]  # chunks of <= 16, cut at the last block boundary before the last token
    warm, starts = run_one(s, mock, req := request("b", prompt, max_tokens=5, stop=()))
    assert warm == cold == generate_alone(prompt, 5, stop=())
    assert starts == [20] and req.cached_tokens == 20
    assert store.restores == 1 and store.all_free()
    check_store(s, store)


def test_a_second_chat_turn_hits_the_first_turns_prompt():
    s, mock, store = make()
    turn1 = prompt_of(22, 2)
    answer, _ = run_one(s, mock, request("t1", turn1, max_tokens=6, stop=()))
    turn2 = turn1 + answer + prompt_of(9, 3)
    tokens, starts = run_one(s, mock, req := request("t2", turn2, max_tokens=4, stop=()))
    assert req.cached_tokens == 20 and starts[0] == 20  # the end of turn 1's last full block
    assert tokens == generate_alone(turn2, 4, stop=())


@pytest.mark.parametrize("interval", [0, 2])
def test_a_kv_hit_without_a_snapshot_recomputes_or_stops_at_the_last_snapshot(interval):
    s, mock, store = make(interval=interval, budget=64)
    base = prompt_of(40, 4)
    run_one(s, mock, request("a", base, max_tokens=2, stop=()))
    other = base[:30] + prompt_of(12, 5)  # shares 7 blocks of KV; snapshots at 36/40, or every 2 blocks
    assert s.kv.find_prefix(other).num_blocks == 7
    tokens, starts = run_one(s, mock, req := request("b", other, max_tokens=3, stop=()))
    assert tokens == generate_alone(other, 3, stop=())
    assert req.cached_tokens == (24 if interval else 0) and starts[0] == req.cached_tokens


def test_snapshots_are_evicted_lru_and_with_their_kv_blocks():
    s, mock, store = make(snapshots=2, num_blocks=20)
    prompts = [prompt_of(10, 10 + i) for i in range(3)]  # points 8 (one snapshot each: 10 // 4 == 9 // 4)
    for i, p in enumerate(prompts):
        run_one(s, mock, request(f"p{i}", p, max_tokens=1, stop=()))
    chains = [prefix_hash(p, 2, BS) for p in prompts]
    assert [store.lookup(c) is not None for c in chains] == [False, True, True]  # the oldest made room
    assert store.evictions == 1 and store.free_snapshots == 2
    # a long prompt takes every KV block: the cached blocks go, and their snapshots with them
    run_one(s, mock, request("big", prompt_of(70, 20), max_tokens=2, stop=()))
    assert all(store.lookup(c) is None for c in chains[1:])
    check_store(s, store)
    again, starts = run_one(s, mock, request("again", prompts[2], max_tokens=1, stop=()))
    assert starts[0] == 0 and again == generate_alone(prompts[2], 1, stop=())


@pytest.mark.parametrize("segments", [(1,), (1, 2)], ids=["one_chunk", "segments"])
def test_soak_with_snapshots_aborts_and_preemptions(segments):
    """Prompts sharing prefixes (and chats resending an answer), random aborts (also mid-step) and forced
    preemptions: tokens equal the mock model's run alone; every block, slot and snapshot reservation comes back."""
    rng = random.Random(7)
    s, mock, store = make(num_blocks=26, snapshots=5, interval=3, segments=segments)
    bases = [prompt_of(rng.randint(4, 30), 900 + i) for i in range(6)]
    pending = []
    for i in range(200):
        prompt = rng.choice(bases)[: rng.randint(1, 30)] + prompt_of(rng.randint(0, 12), 1000 + i)
        pending.append(Request(f"q{i}", prompt or [1], rng.randint(1, 24), frozenset({STOP})))
    specs = {r.request_id: (list(r.prompt_token_ids), r.max_tokens) for r in pending}

    def check(s):
        check_invariants(s)
        check_store(s, store)
        assert store.all_free()  # no reservation outlives its step

    res = soak(s, mock, pending, rng, check)
    streamed, finished, aborted = res.streamed, res.finished, res.aborted
    assert set(finished) | aborted == set(specs)
    for rid, (prompt, max_tokens) in specs.items():
        expected = generate_alone(prompt, max_tokens)
        assert streamed[rid] == (expected if rid in finished else expected[: len(streamed[rid])]), rid
    assert s.kv.all_free() and mock.slots.all_free()
    snap = s.snapshot()
    assert snap.preemptions > 3 and snap.kv.prefix_hits > 10 and store.restores == snap.kv.prefix_hits, snap
    assert store.evictions > 0
