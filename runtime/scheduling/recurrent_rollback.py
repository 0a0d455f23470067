"""Rejected drafts in plans with recurrent state (hybrid families; docs/speculative.md step 4).

A KV cache rolls back by not counting the rejected positions; a recurrent state (a conv window, a gated delta
rule's matrix) cannot: after a verify segment its live slot holds all k + 1 tokens. So before a verify step the
scheduler saves each speculating row's live slots into scratch slots of their own (`saves`, a step's slot
copies: scratch slot = scratch_base + live slot, the slot arrays' last engine_slots entries), and after it:
- every draft accepted: the live state is right (it holds t, d_0..d_{k-1}); nothing to do;
- a draft rejected (or cut by the grammar): the live state holds tokens the request never emitted. The request
  falls back to the segment's start (its computed count, as before the step), its scratch slots are copied
  back before the next step (`restores`), and that step recomputes t and the accepted drafts together with
  the emitted token as an ordinary prefill chunk of the request, which completes it (its last row samples the
  next token, as a decode row would). The KV those positions hold is rewritten with the same values.
A recomputation is one more chunk of a + 2 tokens for the request; the rows rolled back by one verify step
recompute together as the next step's chunks where a compiled layout holds them (else over the next steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .requests import Request
from .scheduled_step import SlotCopy, VerifySegment


class RecurrentRollback:
    def __init__(self, scratch_base: int, kinds: Sequence[str]):
        """scratch_base: the slot arrays' index of the scratch slot of live slot 0; kinds: the slot state kinds
        in index order (SlotCopy.kind)."""
        self.base, self.kinds = scratch_base, tuple(kinds)
        self._restores: dict[str, tuple[Request, int, tuple[SlotCopy, ...]]] = {}  # id -> (request, start, copies)

    def saves(self, requests: Sequence[Request]) -> tuple[SlotCopy, ...]:
        """The copies, before the verify step's forward, of each speculating row's live slots to its scratch."""
        return tuple(
            SlotCopy(k, r.state[kind].slot, self.base + r.state[kind].slot)
            for r in requests
            for k, kind in enumerate(self.kinds)
        )

    def settle(self, request: Request, segment: VerifySegment) -> None:
        """After the verify step's tokens were appended (the request still running): fall back to the segment's
        start when not every token of the segment was kept, its scratch to be restored before the next step."""
        if request.num_computed_tokens >= segment.start + segment.num_tokens:
            return  # t and every draft were kept: the live state is the request's
        request.num_computed_tokens = segment.start
        copies = tuple(
            SlotCopy(k, self.base + request.state[kind].slot, request.state[kind].slot)
            for k, kind in enumerate(self.kinds)
        )
        self._restores[request.request_id] = (request, segment.start, copies)

    def restores(self, running: Callable[[str], Request | None]) -> tuple[SlotCopy, ...]:
        """The restores the step being built applies before its forward: only for requests still running from the
        point they fell back to (an abort or a preemption since then drops the restore: its slots may be another's)."""
        copies = []
        for rid, (request, start, restore) in self._restores.items():
            if running(rid) is request and request.num_computed_tokens == start:
                copies += restore
        self._restores.clear()
        return tuple(copies)
