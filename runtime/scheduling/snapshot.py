"""What a Scheduler reports of itself (Engine.snapshot, the server's metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from ..state.block_pool import KVCounters


@dataclass(frozen=True)
class SchedulerSnapshot:
    active: int  # running requests (they own KV)
    waiting: int  # queued, preempted ones included
    max_num_seqs: int
    max_queue_depth: int
    free_blocks: int  # allocatable now (plain free + evictable cached)
    cached_free_blocks: int
    usable_blocks: int
    block_size: int
    preemptions: int
    finished: int
    aborted: int
    kv: KVCounters


def snapshot_of(scheduler) -> SchedulerSnapshot:
    return SchedulerSnapshot(
        active=len(scheduler.running),
        waiting=len(scheduler.waiting),
        max_num_seqs=scheduler.max_num_seqs,
        max_queue_depth=scheduler.max_queue_depth,
        free_blocks=scheduler.pool.free_blocks,
        cached_free_blocks=scheduler.pool.cached_free_blocks,
        usable_blocks=scheduler.pool.num_usable_blocks,
        block_size=scheduler.pool.block_size,
        preemptions=scheduler.num_preemptions,
        finished=scheduler.num_finished,
        aborted=scheduler.num_aborted,
        kv=scheduler.pool.counters(),
    )
