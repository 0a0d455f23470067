"""The scheduler's run-ahead plans: several decode steps per device call, and the next call dispatched
before the previous one's tokens are back (runtime/scheduling/lookahead.py says when the engine may do either).

extend_decodes turns a just-scheduled decode-only plan into a `steps`-step plan (KV for every row's next
`steps` positions); chain_after_prefill gives the first such plan for the requests a prefill step completes,
dispatched behind that step before its tokens are read. chain_decodes, called while that plan (or the last
chained one) is still on the device, returns the following call's plan: the same rows `steps` positions further, assuming each row goes
on; its input tokens are the previous call's last sampled ones, which stay on the device
(runtime/engine_step.make_multi_step_fn's `carried`). The engine then updates the plans in dispatch order,
update_ahead once per step; a row that ended earlier (eos, a stop, max_tokens, an abort) is skipped, and
what a call computed for it is discarded, as within one call. A chained call writes KV only at positions
past its rows' computed tokens, so it never touches a block the prefix cache holds; blocks a finished row
releases are reused only by calls dispatched after it (the device runs calls in order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .requests import StepOutput
from .scheduled_step import DecodeRow, StepPlan, slots_at


class RunAhead:
    """Mixed into Scheduler: uses its _active, _running, kv, waiting, _unfinished_plan and _ahead (a deque of
    (plan, steps) dispatched and not yet updated, oldest first)."""

    def extend_decodes(self, plan: StepPlan, steps: int) -> StepPlan | None:
        """Let the just-scheduled decode-only `plan` run `steps` decode steps in one go: every row gets KV
        for its next `steps` positions, or up to its last one. Returns the plan with block tables that cover
        them (the engine then calls update_ahead once per step), or None when the pool cannot give every row
        those blocks without preempting (the plan stays a one-step plan; blocks already grown are kept —
        the rows would need them within `steps` steps anyway)."""
        if plan is not self._unfinished_plan or plan.prefills or plan.preempted or steps < 2:
            return None
        extended = self._grown(plan, 0, steps)
        if extended is None:
            return None
        self._unfinished_plan = extended
        self._ahead.append((extended, steps))
        return extended

    def chain_decodes(self, plan: StepPlan, steps: int) -> StepPlan | None:
        """The call after `plan` (the last extended plan dispatched, `steps` steps): its rows `steps`
        positions further, with KV for their next `steps` positions. None — nothing changes — when nobody
        would still be running after `plan` (every row reaches max_tokens in it), a request waits to be
        admitted (it would wait one call longer), a row is no longer running, or the pool cannot grow
        without preempting."""
        if not self._ahead or self._ahead[-1][0] is not plan or self._ahead[-1][1] != steps or self.waiting:
            return None
        requests = [self._running(row.request_id) for row in plan.decodes]
        if any(r is None for r in requests):
            return None
        if all(row.position + steps >= r.peak_context for row, r in zip(plan.decodes, requests)):
            return None
        chained = self._grown(plan, steps, steps)
        if chained is not None:
            self._ahead.append((chained, steps))
        return chained

    def chain_after_prefill(self, plan: StepPlan, steps: int) -> StepPlan | None:
        """The first run-ahead call after the just-scheduled `plan`, a step of prefill chunks only that each
        complete their prompt: every chunk's request as a decode row at the position after its prompt (its
        input token is the one `plan` samples, on the device), with KV for its next `steps` positions. None —
        nothing changes — when `plan` holds decode rows or a chunk that does not complete, a request waits to
        be admitted, a request ends with the token `plan` samples (max_tokens 1), or the pool cannot grow."""
        if (
            plan is not self._unfinished_plan
            or self._ahead
            or plan.decodes
            or plan.preempted
            or not plan.prefills
            or self.waiting
            or not all(chunk.completes for chunk in plan.prefills)
        ):
            return None
        requests = [self._running(chunk.request_id) for chunk in plan.prefills]
        if any(r is None or r.num_tokens >= r.peak_context for r in requests):
            return None
        tables = self._tables_ahead([(r.request_id, r.num_tokens) for r in requests], steps)
        if tables is None:
            return None
        bs = self.kv.block_size
        rows = tuple(
            DecodeRow(r.request_id, 0, r.num_tokens, slots_at(tables[r.request_id], r.num_tokens, bs)) for r in requests
        )  # token 0: the device feeds the sampled one
        chained = StepPlan(rows, (), tables, (), num_kinds=plan.num_kinds)
        self._ahead.append((chained, steps))
        return chained

    def _grown(self, plan: StepPlan, shift: int, steps: int) -> StepPlan | None:
        """`plan` with every row `shift` positions further and blocks for its next `steps` positions (up to the
        request's last position: steps past it write to block 0, StepPlan.decode_slots_ahead, and are
        discarded); None if the pool cannot give them without preempting."""
        rows = tuple(replace(row, position=row.position + shift) for row in plan.decodes) if shift else plan.decodes
        tables = self._tables_ahead([(row.request_id, row.position) for row in rows], steps)
        return None if tables is None else replace(plan, decodes=rows, block_tables=tables)

    def _tables_ahead(self, positions: list[tuple[str, int]], steps: int) -> dict | None:
        """Each (request, position): blocks for its next `steps` positions, up to its last one; their tables, or
        None if the pool cannot give them without preempting (blocks already grown are kept)."""
        requests = [self._active[rid] for rid, _ in positions]
        for (_, position), request in zip(positions, requests):
            if not self.kv.grow(request.state, min(position + steps, request.peak_context)):
                return None
        return {request.request_id: self.kv.tables(request.state) for request in requests}

    def update_ahead(self, plan: StepPlan, step: int, sampled_token_ids: Sequence[int]) -> list[StepOutput]:
        """update() for step `step` (0-based, in order) of the oldest extended plan not yet updated: each row
        still running computed position row.position + step and sampled one token; rows that finished (or
        were aborted) at an earlier step or call are skipped — what they computed after that is discarded."""
        if not self._ahead or self._ahead[0][0] is not plan or not 0 <= step < self._ahead[0][1]:
            raise RuntimeError("update_ahead() got a plan that is not the oldest extended one, or a bad step")
        shifted = replace(plan, decodes=tuple(replace(row, position=row.position + step) for row in plan.decodes))
        self._unfinished_plan = shifted
        if step == self._ahead[0][1] - 1:
            self._ahead.popleft()
        return self.update(shifted, sampled_token_ids)

    def drop_failed(self, plan: StepPlan) -> bool:
        """The call of `plan`, the oldest extended plan not yet updated, failed: forget it without applying
        anything (the engine ends its requests). False if `plan` is not that plan."""
        if not self._ahead or self._ahead[0][0] is not plan:
            return False
        self._ahead.popleft()
        self._unfinished_plan = None
        return True

    def discard_ahead(self, plan: StepPlan) -> None:
        """Drop a chained plan whose call will not be applied (the call before it failed); its KV blocks stay
        with their requests."""
        if not self._ahead or self._ahead[-1][0] is not plan:
            raise RuntimeError("discard_ahead() got a plan that is not the last chained one")
        self._ahead.pop()
