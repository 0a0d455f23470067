"""The scheduler's recurrent-state rollback against a mock model with a mock recurrent state (no device): each
slot records the tokens it consumed, slot copies copy those records, and every row of every step must find its
slot holding exactly the request's tokens before its position. Drafts of random quality, several rows
verified per step and rolled back together (their recomputations share a step in a multi-chunk layout), aborts
and preemptions: plain decoding's tokens, every block and slot back at the end."""

from __future__ import annotations

import random

from test_scheduler import STOP, generate_alone
from test_speculative_scheduler import _verify

from ember.runtime.scheduling.recurrent_rollback import RecurrentRollback
from ember.runtime.scheduling.requests import Request
from ember.runtime.scheduling.scheduled_step import PrefillShapes
from ember.runtime.scheduling.scheduler import Scheduler
from ember.runtime.state.block_pool import BlockPool
from ember.runtime.state.slot_pool import SlotPool

LIVE = 4  # live slots; scratch slot of live slot s: LIVE + s


class MockRecurrentState:
    """slot -> the tokens it consumed, in order (a recurrent state is a function of exactly these)."""

    def __init__(self):
        self.slots: dict[int, list[int]] = {}

    def run(self, step, tokens_of) -> None:
        for copy in step.slot_copies.before:
            self.slots[copy.dst] = list(self.slots.get(copy.src, []))
        rows = [(d.request_id, d.position, (d.token_id,)) for d in step.decodes]
        rows += [(s.request_id, s.start, s.token_ids) for s in (*step.verifies, *step.prefills)]
        for rid, start, tokens in rows:
            slot = step.state_slots[rid][0]
            held = [] if start == 0 else self.slots.get(slot, [])  # a request starting at 0 starts from zero
            assert held == tokens_of(rid)[:start], f"{rid}: its state is not its tokens before {start}"
            self.slots[slot] = held + list(tokens)
        for copy in step.slot_copies.after:
            self.slots[copy.dst] = list(self.slots.get(copy.src, []))


def test_rolled_back_rows_resume_from_their_accepted_tokens():
    rng = random.Random(9)
    prompts = [[rng.randrange(1, 64) for _ in range(rng.randrange(3, 20))] for _ in range(6)]
    truth = {f"r{i}": generate_alone(p, 40) for i, p in enumerate(prompts)}

    def drafts(request, k):  # right for a random while, then wrong: every verify rolls back
        done, n = len(request.output_token_ids), rng.randrange(1, k + 1)
        good = rng.randrange(0, n)
        return [t if i < good else (t + 1) % 64 for i, t in enumerate(truth[request.request_id][done : done + n])]

    pool = BlockPool(24, 4)  # too small for four long sequences at once: preemptions
    slots = SlotPool(LIVE, "rec")
    scheduler = Scheduler(
        pool,
        LIVE,
        64,
        64,
        (16, 32),
        extra_state={"rec": slots},
        prefill_shapes=PrefillShapes((16, 32), segments=(1, 2, 4), segment_max_tokens=16),
        draft_source=drafts,
        num_speculative_tokens=4,
        rollback=RecurrentRollback(LIVE, ["rec"]),
    )
    requests = {f"r{i}": Request(f"r{i}", p, 40, stop_token_ids=frozenset({STOP})) for i, p in enumerate(prompts)}
    for request in requests.values():
        scheduler.add(request)
    state, rolled_back_together, aborted = MockRecurrentState(), 0, set()
    while scheduler.has_work:
        step = scheduler.schedule()
        restores = {c.dst for c in step.slot_copies.before if c.src >= LIVE}
        rolled_back_together += len(restores) > 1 and len(step.prefills) > 1
        state.run(step, lambda rid: list(requests[rid].all_token_ids))
        scheduler.update(step, _verify(step, lambda rid: list(requests[rid].all_token_ids)))
        if step.verifies and rng.random() < 0.05:
            victim = rng.choice(step.verifies).request_id
            if scheduler.abort(victim):
                aborted.add(victim)
        pool.check_consistency()
    assert rolled_back_together > 0 and scheduler.num_preemptions > 0
    for rid, request in requests.items():
        if rid not in aborted:
            assert request.output_token_ids == truth[rid]
    assert pool.free_blocks == pool.num_usable_blocks and slots.all_free()
