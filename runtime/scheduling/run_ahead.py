"""Run-ahead steps: several decode steps per device call, and the next call dispatched before the previous
one's tokens are back (runtime/scheduling/lookahead.py says when the engine may do either).

The Scheduler owns one RunAhead and asks it for these steps (Scheduler.extend_decodes, chain_decodes,
chain_after_prefill); RunAhead grows the rows' KV and keeps the run-ahead steps dispatched and not yet
updated, oldest first. It sees the scheduler's requests only through the `running` lookup it is given.

An extended step is a just-scheduled decode-only step with KV for every row's next `steps` positions; the
step after a prefill step is the first such step for the requests that prefill completes, dispatched behind
it before its tokens are read. A chained step, asked for while the previous run-ahead step is still on the
device, is the same rows `steps` positions further, assuming each row goes on; its input tokens are the
previous call's last sampled ones, which stay on the device (runtime/execution/engine_step.make_multi_step_fn's
`carried`). The engine then updates the steps in dispatch order, once per decode step (step_at); a row that
ended earlier (eos, a stop, max_tokens, an abort) is skipped, and what a call computed for it is discarded,
as within one call. A chained call writes KV only at positions past its rows' computed tokens, so it never
touches a block the prefix cache holds; blocks a finished row releases are reused only by calls dispatched
after it (the device runs calls in order).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ..state.kv_cache import KVCache
from .requests import Request
from .scheduled_step import DecodeRow, ScheduledStep, slots_at


class RunAhead:
    def __init__(self, kv: KVCache, running: Callable[[str], Request | None]):
        self.kv = kv
        self._running = running  # request id -> the running request, None once it ended
        self._dispatched: deque[tuple[ScheduledStep, int]] = deque()  # (step, decode steps), oldest first

    @property
    def pending(self) -> bool:
        """Whether a run-ahead step was dispatched and is not fully updated yet."""
        return bool(self._dispatched)

    def extend(self, step: ScheduledStep, steps: int) -> ScheduledStep | None:
        """The decode-only `step` with KV for every row's next `steps` positions (up to its last one); None when
        the pool cannot give every row those blocks without preempting (blocks already grown are kept — the
        rows would need them within `steps` steps anyway)."""
        extended = self._grown(step, 0, steps)
        if extended is not None:
            self._dispatched.append((extended, steps))
        return extended

    def chain_decodes(self, step: ScheduledStep, steps: int) -> ScheduledStep | None:
        """The call after `step` (the last run-ahead step dispatched, `steps` steps): its rows `steps` positions
        further, with KV for their next `steps` positions. None — nothing changes — when nobody would still be
        running after `step` (every row reaches max_tokens in it), a row is no longer running, or the pool
        cannot grow without preempting."""
        if not self._dispatched or self._dispatched[-1][0] is not step or self._dispatched[-1][1] != steps:
            return None
        requests = [self._running(row.request_id) for row in step.decodes]
        if any(r is None for r in requests):
            return None
        if all(row.position + steps >= r.peak_context for row, r in zip(step.decodes, requests)):
            return None
        chained = self._grown(step, steps, steps)
        if chained is not None:
            self._dispatched.append((chained, steps))
        return chained

    def after_prefill(self, step: ScheduledStep, steps: int) -> ScheduledStep | None:
        """The first run-ahead step after `step`, prefill chunks that each complete their prompt: every chunk's
        request as a decode row at the position after its prompt (its input token is the one `step` samples, on
        the device), with KV for its next `steps` positions. None — nothing changes — when a request ends with
        the token `step` samples (max_tokens 1) or the pool cannot grow."""
        requests = [self._running(chunk.request_id) for chunk in step.prefills]
        if any(r is None or r.num_tokens >= r.peak_context for r in requests):
            return None
        tables = self._tables_ahead([(r, r.num_tokens) for r in requests], steps)
        if tables is None:
            return None
        bs = self.kv.block_size
        rows = tuple(
            DecodeRow(r.request_id, 0, r.num_tokens, slots_at(tables[r.request_id], r.num_tokens, bs)) for r in requests
        )  # token 0: the device feeds the sampled one
        chained = ScheduledStep(
            rows,
            (),
            tables,
            (),
            num_kinds=step.num_kinds,
            state_slots=step.state_slots,
            num_slot_kinds=step.num_slot_kinds,
        )
        self._dispatched.append((chained, steps))
        return chained

    def step_at(self, step: ScheduledStep, index: int) -> ScheduledStep:
        """Decode step `index` (0-based, in order) of `step`, the oldest run-ahead step not yet updated: every row
        `index` positions further. After its last index the step is no longer pending."""
        if not self._dispatched or self._dispatched[0][0] is not step or not 0 <= index < self._dispatched[0][1]:
            raise RuntimeError("update_ahead() got a step that is not the oldest extended one, or a bad index")
        if index == self._dispatched[0][1] - 1:
            self._dispatched.popleft()
        return replace(step, decodes=tuple(replace(row, position=row.position + index) for row in step.decodes))

    def drop_oldest(self, step: ScheduledStep) -> bool:
        """Forget `step` if it is the oldest run-ahead step not yet updated (its call failed, or it was updated
        whole as a one-step step); False otherwise."""
        if not self._dispatched or self._dispatched[0][0] is not step:
            return False
        self._dispatched.popleft()
        return True

    def drop_newest(self, step: ScheduledStep) -> None:
        """Forget the chained `step`, whose call will not be applied (the call before it failed); its KV blocks
        stay with their requests."""
        if not self._dispatched or self._dispatched[-1][0] is not step:
            raise RuntimeError("discard_ahead() got a step that is not the last chained one")
        self._dispatched.pop()

    def _grown(self, step: ScheduledStep, shift: int, steps: int) -> ScheduledStep | None:
        """`step` with every row `shift` positions further and blocks for its next `steps` positions (up to the
        request's last position: steps past it write to block 0, ScheduledStep.decode_slots_ahead, and are
        discarded); None if the pool cannot give them without preempting."""
        rows = tuple(replace(row, position=row.position + shift) for row in step.decodes) if shift else step.decodes
        tables = self._tables_ahead([(self._running(row.request_id), row.position) for row in rows], steps)
        return None if tables is None else replace(step, decodes=rows, block_tables=tables)

    def _tables_ahead(self, positions: list[tuple[Request, int]], steps: int) -> dict | None:
        """Each (request, position): blocks for its next `steps` positions, up to its last one; their tables, or
        None if the pool cannot give them without preempting (blocks already grown are kept)."""
        for request, position in positions:
            if not self.kv.grow(request.state, min(position + steps, request.peak_context)):
                return None
        return {request.request_id: self.kv.tables(request.state) for request, _ in positions}
