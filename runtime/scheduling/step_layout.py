"""A ScheduledStep laid out from the scheduler's decisions: each request's block tables, its rows (decode rows,
verify segments, prefill chunks) with their tokens and KV slots, and its slot-state indices."""

from __future__ import annotations

from collections.abc import Sequence

from ..state.kv_cache import KVCache
from .requests import Request
from .scheduled_step import DecodeRow, PrefillChunk, ScheduledStep, SlotCopies, slots_at, state_slots_of
from .speculation import verify_segment


def lay_out_step(
    kv: KVCache,
    slot_kinds: tuple[str, ...],
    decodes: Sequence[Request],
    verifies: Sequence[tuple[Request, tuple[int, ...], object]],
    chunks: Sequence[tuple[Request, int, int]],
    preempted: Sequence[str],
    copies: SlotCopies,
) -> ScheduledStep:
    """decodes: requests decoding one token; verifies: (request, its drafts, their q rows or None); chunks: (request, start, end) of
    its prompt; preempted: request ids sent back this step; copies: the step's snapshot copies."""
    bs = kv.block_size
    tables = {
        r.request_id: kv.tables(r.state) for r in (*decodes, *(r for r, _, _ in verifies), *(r for r, _, _ in chunks))
    }
    rows = []
    for request in decodes:
        pos = request.num_computed_tokens
        rows.append(
            DecodeRow(
                request.request_id, request.all_token_ids[pos], pos, slots_at(tables[request.request_id], pos, bs)
            )
        )
    segments = [verify_segment(r, drafts, tables[r.request_id], bs, probs) for r, drafts, probs in verifies]
    prefills = [
        PrefillChunk(
            request.request_id,
            start,
            tuple(request.all_token_ids[start:end]),
            tuple(slots_at(tables[request.request_id], p, bs) for p in range(start, end)),
            completes=end == request.num_tokens,
        )
        for request, start, end in chunks
    ]
    owners = [*decodes, *(r for r, _, _ in verifies), *(r for r, _, _ in chunks)]
    slots = state_slots_of(owners, slot_kinds)
    return ScheduledStep(
        tuple(rows), tuple(prefills), tables, tuple(preempted), len(kv.kinds), *slots, copies, tuple(segments)
    )
