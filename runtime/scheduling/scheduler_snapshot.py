"""What Scheduler.snapshot() reports: the scheduler's load and its KV pool's state, for metrics and the server."""

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
