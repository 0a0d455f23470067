"""The scheduler with a recurrent (slot) state kind beside paged KV kinds, against the mock plan of
test_scheduler.py plus a shadow recurrent state: each slot holds the tokens its request has run through, in
order. Every token must find its request's slot holding exactly the tokens before it (position 0: a fresh
state), so a slot shared by two requests, carried across a preemption or skipped by a prefix hit fails."""

from __future__ import annotations

import random

import pytest
from scheduler_support import slot_scheduler, soak
from test_scheduler import STOP, MockPlan, check_invariants, generate_alone, prompt_of, request

from ember.runtime.scheduling.requests import Request
from ember.runtime.scheduling.scheduled_step import ScheduledStep
from ember.runtime.scheduling.scheduler import Scheduler
from ember.runtime.state.block_pool import BlockPool
from ember.runtime.state.slot_pool import FREED, SlotPool

KIND = "recurrent"


class RecurrentMock(MockPlan):
    def __init__(self, scheduler: Scheduler, slots: SlotPool):
        super().__init__(scheduler)
        self.slots = slots
        self.state: dict[int, list[int]] = {}  # slot -> the tokens run through it

    def run(self, plan: ScheduledStep) -> list[int]:
        assert plan.num_slot_kinds == 1
        ids = [r.request_id for r in plan.decodes] + [c.request_id for c in plan.prefills]
        slots = [plan.state_slots[rid][0] for rid in ids]
        assert len(set(slots)) == len(slots) and all(0 <= s < self.slots.num_slots for s in slots)
        for rid in ids:
            assert self.scheduler.get(rid).state[KIND].slot == plan.state_slots[rid][0]
        tokens = [(r.request_id, r.position, r.token_id) for r in plan.decodes]
        tokens += [(c.request_id, c.start + i, t) for c in plan.prefills for i, t in enumerate(c.token_ids)]
        for rid, pos, token in tokens:  # the step's flat tokens, in order, as the plan scans them
            slot = plan.state_slots[rid][0]
            if pos == 0:
                self.state[slot] = []
            truth = self.scheduler.get(rid).all_token_ids
            assert self.state.get(slot) == truth[:pos], f"{rid} at {pos} finds a wrong recurrent state"
            self.state[slot].append(token)
        return super().run(plan)


def make_hybrid(num_slots=8, **kw):
    slots = SlotPool(num_slots, KIND)
    s = slot_scheduler(BlockPool(kw.pop("num_blocks", 40), 4), slots, kw)
    return s, RecurrentMock(s, slots), slots


def test_slot_pool_hands_out_and_takes_back():
    pool = SlotPool(2, KIND)
    a, b = pool.new_allocation(), pool.new_allocation()
    assert {a.slot, b.slot} == {0, 1} and not pool.can_allocate()
    pool.release(a)
    pool.release(a)  # twice: harmless
    assert a.slot == FREED and pool.free_slots == 1
    pool.release(b)
    pool.check_consistency()
    assert pool.all_free()
    with pytest.raises(ValueError):
        SlotPool(0, KIND)


def test_prefix_cache_is_off_with_a_recurrent_kind():
    s, mock, slots = make_hybrid()
    assert not s.prefix_caching
    shared = prompt_of(24, 3)
    first_chunk = {}
    for rid in ("a", "b"):  # the same prompt twice: b's blocks are cached by a, yet b computes them all
        s.add(req := request(rid, shared, max_tokens=3, stop=()))
        while s.has_work:
            plan = s.schedule()
            for c in plan.prefills:
                first_chunk.setdefault(c.request_id, c.start)
            s.update(plan, mock.run(plan))
        assert req.cached_tokens == 0
    assert first_chunk == {"a": 0, "b": 0}
    assert s.kv.find_prefix(shared).num_blocks > 0  # the blocks were there to hit
    assert s.snapshot().kv.prefix_hits == 0 and slots.all_free()


def test_fewer_slots_than_seqs_bound_the_running_requests():
    s, mock, slots = make_hybrid(num_slots=2, max_num_seqs=8)
    for i in range(5):
        s.add(request(f"r{i}", prompt_of(6, i), max_tokens=4, stop=()))
    peak = 0
    while s.has_work:
        plan = s.schedule()
        peak = max(peak, len(s.running))
        s.update(plan, mock.run(plan))
    assert peak == 2 and slots.all_free()


@pytest.mark.parametrize("segments", [(1,), (1, 2)], ids=["one_chunk", "segments"])
def test_soak_with_a_recurrent_kind(segments):
    """Random prompts, aborts (also mid-step) and forced preemptions: tokens equal the mock model's run alone,
    and every block and slot comes back."""
    rng = random.Random(99)
    s, mock, slots = make_hybrid(num_blocks=30, segments=segments)
    pending = [
        Request(f"q{i}", prompt_of(rng.randint(1, 40), 500 + i), rng.randint(1, 20), frozenset({STOP}))
        for i in range(200)
    ]
    specs = {r.request_id: (list(r.prompt_token_ids), r.max_tokens) for r in pending}

    def check(s):
        check_invariants(s)
        slots.check_consistency()
        assert slots.free_slots == slots.num_slots - len(s.running)  # a slot per running request, no more

    res = soak(s, mock, pending, rng, check)
    streamed, finished, aborted = res.streamed, res.finished, res.aborted
    assert set(finished) | aborted == set(specs)
    for rid, (prompt, max_tokens) in specs.items():
        expected = generate_alone(prompt, max_tokens)
        assert streamed[rid] == (expected if rid in finished else expected[: len(streamed[rid])]), rid
    assert s.kv.all_free() and slots.all_free()
    snap = s.snapshot()
    assert snap.preemptions > 5 and snap.kv.prefix_hits == 0 and 5 < len(aborted) < 100, snap
