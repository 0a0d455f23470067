"""RecurrentRollback (runtime/scheduling/recurrent_rollback.py) on its own: which slot copies a verify step saves,
when a verified row falls back to its segment's start, and that a restore is dropped for a request aborted,
preempted or moved on since (its slots may be another request's by then)."""

from ember.runtime.scheduling.recurrent_rollback import RecurrentRollback
from ember.runtime.scheduling.requests import Request
from ember.runtime.scheduling.scheduled_step import SlotCopy, VerifySegment
from ember.runtime.state.slot_pool import SlotPool

KINDS = ("conv", "delta")
BASE = 10  # scratch slot of live slot s: BASE + s


def _running(slot_pools, rid, computed):
    request = Request(rid, [1, 2, 3], max_tokens=20)
    request.state = {kind: pool.new_allocation() for kind, pool in slot_pools.items()}
    request.num_computed_tokens = computed
    return request


def _segment(request, drafts):
    slots = tuple((0,) for _ in range(1 + drafts))
    return VerifySegment(request.request_id, request.num_computed_tokens, (7,) * (1 + drafts), slots)


def test_saves_restores_and_dropped_restores():
    pools = {kind: SlotPool(4, kind) for kind in KINDS}
    rollback = RecurrentRollback(BASE, KINDS)
    a, b, c = (_running(pools, rid, 5) for rid in "abc")
    live = {r.request_id: r.state["conv"].slot for r in (a, b, c)}
    assert rollback.saves([a, b]) == tuple(
        SlotCopy(k, live[r.request_id], BASE + live[r.request_id]) for r in (a, b) for k in range(2)
    )
    segments = {r.request_id: _segment(r, 3) for r in (a, b, c)}
    a.num_computed_tokens += 4  # every draft accepted: t + 3 drafts computed, the live state is right
    b.num_computed_tokens += 2  # one draft accepted, two rejected
    c.num_computed_tokens += 1  # none accepted
    for r in (a, b, c):
        rollback.settle(r, segments[r.request_id])
    assert (a.num_computed_tokens, b.num_computed_tokens, c.num_computed_tokens) == (9, 5, 5)
    running = {"b": b}  # c was aborted (or preempted) before the next step was built
    restores = rollback.restores(running.get)
    assert restores == tuple(SlotCopy(k, BASE + live["b"], live["b"]) for k in range(2))
    assert rollback.restores(running.get) == ()  # applied once
    rollback.settle(b, _segment(b, 2))  # b verified again from 5, nothing kept past t: falls back to 5
    b.num_computed_tokens = 0  # ... then preempted: it recomputes from 0, its old scratch means nothing
    assert rollback.restores(running.get) == ()
