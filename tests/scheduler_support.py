"""What the scheduler tests share: the random soak loop (test_scheduler.py, test_scheduler_slots.py,
test_prefix_snapshots.py): requests added while the queue takes them, random aborts (also while a step is "on the
device") and the mock plan's steps, with a per-step check of the caller's invariants; the scheduler of the recurrent-slot tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.runtime.scheduling.requests import QueueFullError, Request
from ember.runtime.scheduling.scheduled_step import PrefillShapes
from ember.runtime.scheduling.scheduler import Scheduler
from ember.runtime.state.block_pool import BlockPool
from ember.runtime.state.kv_cache import KVCache
from ember.runtime.state.slot_pool import SlotPool


@dataclass
class SoakResult:
    streamed: dict[str, list[int]]  # request id -> the tokens it was sent
    finished: dict[str, str] = field(default_factory=dict)  # request id -> finish reason
    aborted: set[str] = field(default_factory=set)
    overloads: int = 0  # adds refused with QueueFullError (retried later)


def soak(s, mock, requests: list[Request], rng, check, max_steps: int = 10_000) -> SoakResult:
    """Drive `s` with `mock` until every request of `requests` (in submission order) has been added and the
    scheduler has no work; check(s) after every step. Fails if it does not drain in max_steps."""
    pending = list(reversed(requests))
    result = SoakResult({r.request_id: [] for r in requests})
    for _ in range(max_steps):
        while pending and rng.random() < 0.6:
            try:
                s.add(pending[-1])
                pending.pop()
            except QueueFullError:
                result.overloads += 1
                break
        if rng.random() < 0.04 and s.has_work:
            rid = rng.choice([r.request_id for r in list(s.waiting) + s.running])
            assert s.abort(rid) and rid not in result.aborted
            result.aborted.add(rid)
        if not s.has_work:
            if not pending:
                break
            continue
        plan = s.schedule()
        sampled = mock.run(plan)
        live = [rid for rid in plan.logit_request_ids if s.get(rid) is not None]  # (a mock may have aborted some)
        if live and rng.random() < 0.02:  # abort while the step is "on the device"
            rid = rng.choice(live)
            assert s.abort(rid)
            result.aborted.add(rid)
        for out in s.update(plan, sampled):
            assert out.request_id not in result.finished and out.request_id not in result.aborted, (
                "answered after its end"
            )
            result.streamed[out.request_id] += out.new_token_ids
            if out.finish_reason:
                result.finished[out.request_id] = out.finish_reason
        check(s)
    else:
        raise AssertionError("soak did not drain")
    assert not pending and not s.has_work
    return result


def slot_scheduler(pool: BlockPool, slots: SlotPool, kw: dict, **extra) -> Scheduler:
    """A Scheduler over the paged KV kind "kv" (pool) and a recurrent kind (slots), with the slot tests' limits;
    kw's max_num_seqs, budget, depth, segments and host_tier (popped) override them, extra goes to the Scheduler."""
    return Scheduler(
        KVCache({"kv": pool}, host_tier=kw.pop("host_tier", None)),
        kw.pop("max_num_seqs", 8),
        kw.pop("budget", 24),
        kw.pop("depth", 12),
        (8, 16),
        prefill_shapes=PrefillShapes((8, 16), kw.pop("segments", (1,)), 8),
        extra_state={slots.kind: slots},
        **extra,
    )
