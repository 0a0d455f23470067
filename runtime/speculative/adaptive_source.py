"""Adaptive draft lengths inside the engine (docs/speculative.md step 5): a drafter behind a per-step plan.

Before each step the scheduler asks `plan` for k per decode row: each request's acceptance alpha (an
`AcceptanceTracker`, learned from its own verify steps) and a step-cost model go to `plan_draft_lengths`,
which drafts only where the expected tokens per second of the whole step rise. The cost model is linear in
the step's tokens, in units of a batch-1 decode step: 1 + verify_token_cost * tokens (a decode step at small
batch is bound by reading the weights, so an extra token costs a fraction of it), plus draft_token_cost per
drafted token (0 for lookup; a draft model's decode per token), plus a fixed call overhead for a drafting step
where plain decode steps run ahead several per call (RUN_AHEAD_CALL_OVERHEAD: a drafting step is a call of its
own). Under load (many rows) the per-token term dominates and every k falls to 0: speculation stops where it
would cost aggregate throughput; with a call overhead it starts only where acceptance repays the call. The
model is an estimate: `MeasuredGate` (measured_gate.py) times what drafting and plain steps really yield per
token and holds the drafts back while drafting is the slower.

What each row accepted is read back from the request itself: the drafts proposed at a given output length
and the tokens the request emitted after it (their common prefix is what the verifier accepted).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .adaptive import AcceptanceTracker, plan_draft_lengths
from .drafter import Draft, Drafter, draft_context
from .measured_gate import MeasuredGate


class AdaptiveDrafts:
    def __init__(
        self,
        drafter: Drafter,
        max_drafts: int,
        verify_token_cost: float,
        draft_token_cost: float,
        call_overhead: float = 0.0,  # a drafting step's own device call where plain steps run ahead
    ):
        self.drafter, self.max_drafts = drafter, max_drafts
        self.verify_token_cost, self.draft_token_cost = verify_token_cost, draft_token_cost
        self.call_overhead = call_overhead
        self.tracker = AcceptanceTracker()
        self.gate = MeasuredGate()  # drafts only while drafting steps are measured no slower per token
        self.row_state = None  # request id -> its RowState (the engine's), for drafters that sample as it does
        self._pending: dict[str, tuple[int, tuple[int, ...]]] = {}  # request -> (output length, drafts proposed)

    def plan(self, requests: Sequence) -> dict[str, int]:
        """k per request of the step being scheduled (its decode rows: request_id, output_token_ids), as the cost
        model plans them and the measured gate lets them through."""
        return self.gate.admit(requests, self._planned(requests))

    def would_draft(self, requests: Sequence) -> bool:
        """Whether a step of these rows scheduled now would draft (asked before a run-ahead call is chained)."""
        return self.gate.would_draft(self._planned(requests))

    def _planned(self, requests: Sequence) -> dict[str, int]:
        for request in requests:
            self._learn(request)
        alphas = [self.tracker.alpha(r.request_id) for r in requests]
        ks = plan_draft_lengths(alphas, self.max_drafts, self._step_time, self._draft_time, self.call_overhead)
        return {r.request_id: k for r, k in zip(requests, ks)}

    def __call__(self, request, k: int) -> Draft:
        """The scheduler's DraftSource: the drafter's proposal (its tokens, and q rows of a sampling drafter)."""
        draft = self.drafter.propose(draft_context(request, self.row_state), k)
        if draft.token_ids:
            self._pending[request.request_id] = (len(request.output_token_ids), tuple(draft.token_ids))
        return draft

    def release(self, request_id: str) -> None:
        self.drafter.release(request_id)
        self.tracker.forget(request_id)
        self._pending.pop(request_id, None)

    def _learn(self, request) -> None:
        pending = self._pending.get(request.request_id)
        output = request.output_token_ids
        if pending is None or len(output) <= pending[0]:
            return  # no draft, or its step's tokens are not in yet
        start, drafts = self._pending.pop(request.request_id)
        emitted = output[start : start + len(drafts)]
        accepted = 0
        while accepted < len(emitted) and accepted < len(drafts) and emitted[accepted] == drafts[accepted]:
            accepted += 1
        self.tracker.update(request.request_id, len(drafts), accepted)

    def _step_time(self, tokens: np.ndarray) -> np.ndarray:
        return 1.0 + self.verify_token_cost * tokens.astype(np.float64)

    def _draft_time(self, drafted: np.ndarray) -> np.ndarray:
        return self.draft_token_cost * drafted.astype(np.float64)
