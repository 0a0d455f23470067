"""Continuous-batching scheduler: which requests run in the next engine step, and with which KV slots.

A step (see ember.compiler.batch) runs B decode rows (one token each) then prefill chunks of C tokens
in all (one chunk per sequence), B + C <= max_batched_tokens. schedule() builds a ScheduledStep, the engine runs the
step and samples one token per logit row, update() feeds those tokens back. The engine thread owns
the scheduler: schedule → run → update, strictly alternating.

Policies (what we chose, and why):
- KV is allocated on demand — per prefill chunk, and one block when a decode crosses a block
  boundary — not reserved for prompt + max_tokens at admission. Reserving wastes most of the pool
  (few requests reach max_tokens) and caps concurrency; the price is that a decode can find the pool
  dry: then the most recently admitted running request is preempted (its blocks freed — full ones
  stay in the prefix cache — its computed count reset to 0, its generated tokens kept) and put at the
  front of the waiting queue. It re-prefills prompt + generated tokens later, mostly as a prefix hit.
- Decodes first (oldest first), then prefill chunks fill the rest of the token budget: the one
  request in the middle of its prefill if any, then the head of the waiting queue (admitted with a
  prefix-cache match), and, where the target compiles several chunks per step (PrefillShapes), more
  waiting requests whose whole prompt fits beside them — so a burst of short prompts is admitted in a
  few steps, not one step each. Only the last chunk of a step may stop short of its prompt's end, so at
  most one request is ever mid-prefill. A new prefill never preempts anyone: it takes only free blocks,
  or waits.
- A chunk that does not finish the prompt ends on a block boundary (when it is >= one block), so its
  blocks are full and enter the prefix cache at once; chunks never exceed the largest prefill bucket.
- Any running request with exactly one token left to compute is a decode row — a prompt whose last
  token remains after a chunk or a prefix hit included: a decode row is a one-token chunk with logits.
- KV is one pool per paged state kind (runtime/state/kv_cache.py): growth, preemption and frees cover every
  kind at once; a sliding-window kind drops the blocks its window left behind after each step.
- Slot state kinds (runtime/state/slot_pool.py) are `extra_state`: a slot of each per running request. With
  a snapshot store their prefix hits resume from recurrent-state snapshots (runtime/scheduling/prefix_snapshots.py).
- Speculative decoding: a decode row may carry drafts (a verify segment); runtime/scheduling/speculation.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..state.block_pool import BlockPool, StateAllocator
from ..state.kv_cache import KVCache, PrefixHit
from .prefix_snapshots import NoSnapshots, SnapshotPlanner
from .recurrent_rollback import RecurrentRollback
from .requests import QueueFullError, Request, RequestStatus, RequestTooLongError, StepOutput
from .run_ahead import RunAhead
from .scheduled_step import PrefillShapes, ScheduledStep, SlotCopies
from .snapshot import SchedulerSnapshot, snapshot_of
from .speculation import DraftSource, draft_lengths, emitted_by_row, plans_drafts, settle_verified, take_drafts
from .step_layout import lay_out_step


class Scheduler:
    def __init__(
        self,
        kv: KVCache | BlockPool,
        max_num_seqs: int,
        max_batched_tokens: int,
        max_queue_depth: int,
        prefill_chunk_buckets: Sequence[int],
        *,
        enable_prefix_caching: bool = True,
        extra_state: Mapping[str, StateAllocator] | None = None,
        prefill_shapes: PrefillShapes | None = None,
        snapshots: SnapshotPlanner | None = None,
        draft_source: DraftSource | None = None,
        num_speculative_tokens: int = 0,
        rollback: RecurrentRollback | None = None,
    ):
        if max_num_seqs < 1 or max_batched_tokens < 1 or max_queue_depth < 1:
            raise ValueError("max_num_seqs, max_batched_tokens and max_queue_depth must be >= 1")
        if not prefill_chunk_buckets or min(prefill_chunk_buckets) < 1:
            raise ValueError(f"bad prefill_chunk_buckets {prefill_chunk_buckets!r}")
        # every paged KV kind (a lone BlockPool is the one full-attention kind "kv")
        self.kv = kv if isinstance(kv, KVCache) else KVCache({kv.kind: kv})
        self.pool = self.kv.primary  # the full-attention pool: counters, free-block reports
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.max_queue_depth = max_queue_depth
        # which sets of chunks one step may carry (default: one chunk per step)
        self.prefill_shapes = prefill_shapes or PrefillShapes(tuple(sorted(prefill_chunk_buckets)))
        self.max_chunk = max(self.prefill_shapes.buckets)
        # kind -> allocator of every non-KV state a request owns while running (slot kinds: runtime/state/slot_pool.py)
        self.extra_state: dict[str, StateAllocator] = dict(extra_state or {})
        # slot kinds reuse a prefix only through recurrent-state snapshots (none: the prefix cache is off)
        reusable = snapshots is not None or all(a.supports_prefix_reuse for a in self.extra_state.values())
        self.prefix_caching = enable_prefix_caching and reusable
        self.snapshots = snapshots if snapshots is not None and self.prefix_caching else NoSnapshots()
        self.waiting: deque[Request] = deque()  # FIFO; preempted requests go back to the front
        self.running: list[Request] = []  # admission order: the last one is preempted first
        self._active: dict[str, Request] = {}  # waiting + running, by id
        self._unfinished: ScheduledStep | None = None  # scheduled (or the run-ahead step at hand), not yet updated
        self.run_ahead = RunAhead(self.kv, self._running)  # run-ahead steps dispatched, not yet updated
        self.num_preemptions = self.num_finished = self.num_aborted = 0
        # speculative decoding (runtime/scheduling/speculation.py): up to k drafts per decode row
        self.draft_source, self.num_speculative_tokens = draft_source, num_speculative_tokens
        self.on_release: Callable[[str], None] | None = None  # a request's state went back (a drafter's too)
        self.rollback = rollback  # rejected drafts' recurrent state (runtime/scheduling/recurrent_rollback.py)

    # --- intake -------------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        if request.request_id in self._active:
            raise ValueError(f"request id {request.request_id!r} is already active")
        if request.status is not RequestStatus.WAITING or request.num_computed_tokens or request.output_token_ids:
            raise ValueError(f"request {request.request_id!r} was already scheduled once")
        needed = self.pool.blocks_for(request.peak_context)
        if not self.kv.fits_alone(request.peak_context):
            raise RequestTooLongError(
                f"request {request.request_id!r} needs {needed} KV blocks of {self.pool.block_size} tokens "
                f"(prompt {request.num_prompt_tokens} + max_tokens {request.max_tokens}); the pool has "
                f"{self.pool.num_usable_blocks}"
            )
        if len(self.waiting) >= self.max_queue_depth:
            raise QueueFullError(
                f"server overloaded: {len(self.waiting)} requests waiting (max queue depth {self.max_queue_depth})"
            )
        self.waiting.append(request)
        self._active[request.request_id] = request

    def can_admit(self, num_tokens: int = 0) -> bool:
        """Whether add() would queue a request now and the pool has free blocks for num_tokens of it.
        The engine's bounded wait for KV capacity polls this."""
        return len(self.waiting) < self.max_queue_depth and self.kv.has_room_for(num_tokens)

    def get(self, request_id: str) -> Request | None:
        return self._active.get(request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step -----------------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep:
        if self._unfinished is not None or self.run_ahead.pending:
            raise RuntimeError("schedule() called before update() of the previous step")
        budget = self.max_batched_tokens
        preempted: list[str] = []
        decodes: list[Request] = []
        verifies: list[tuple[Request, tuple[int, ...], Any]] = []  # (request, drafts, their q rows or None)
        lengths = draft_lengths(self.draft_source, self.num_speculative_tokens, self.waiting, self.running)
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            k = min(lengths.get(request.request_id, 0), budget - 1)
            drafts, probs = take_drafts(self.kv, request, self.draft_source, k) if k > 0 else ((), None)
            if drafts:
                verifies.append((request, drafts, probs))
                budget -= 1 + len(drafts)
            elif request.num_tokens_to_compute == 1:
                if not self._grow_or_preempt(request, request.num_computed_tokens + 1, preempted):
                    break  # it was the newest running request: nobody after it is left
                decodes.append(request)
                budget -= 1
            i += 1
        # after a preemption the pool is short: continue a started prefill, admit nobody new this step
        chunks = self._schedule_chunks(budget, admit=not preempted) if budget > 0 else []
        step = self._build_step(decodes, chunks, preempted, verifies)
        if not step.is_empty:
            self._unfinished = step
        return step

    def _grow_or_preempt(self, request: Request, num_tokens: int, preempted: list[str]) -> bool:
        while not self.kv.grow(request.state, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._release_state(request)
        request.num_computed_tokens = 0  # recompute prompt + generated tokens on return
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)  # never dropped; first in line

    def _schedule_chunks(self, budget: int, admit: bool) -> list[tuple[Request, int, int]]:
        """(request, start, end) of each prefill chunk of the step, allocating their blocks: the requests
        mid-prefill first (one, or the rows a verify step rolled back: short chunks), then admissions while the budget, the pool and a compiled layout allow. Every
        chunk but the last completes its prompt."""
        chunks: list[tuple[Request, int, int]] = []
        for request in [r for r in self.running if r.num_tokens_to_compute > 1]:
            start = request.num_computed_tokens
            end = self._chunk_end(request, start, budget, self.kv.tokens_coverable(request.state))
            if end <= start:
                return chunks  # pool dry: it keeps its blocks and continues when decodes free some
            longest = max([e - s for _, s, e in chunks] + [end - start])
            if chunks and (end < request.num_tokens or not self.prefill_shapes.fits(len(chunks) + 1, longest)):
                return chunks  # joining others: whole, in a compiled layout; else it continues next step
            assert self.kv.grow(request.state, end)
            chunks.append((request, start, end))
            budget -= end - start
            if end < request.num_tokens:
                return chunks
        while (
            admit
            and budget > 0
            and self.waiting
            and len(self.running) < self.max_num_seqs
            and len(chunks) < self.prefill_shapes.max_segments
            and all(a.can_allocate() for a in self.extra_state.values())
        ):
            request = self.waiting[0]
            hit = self.kv.no_hit()
            if self.prefix_caching:
                hit = self.kv.find_prefix(request.all_token_ids, self.snapshots.resumable)
            start = hit.num_blocks * self.kv.block_size
            end = self._chunk_end(request, start, budget, self.kv.tokens_coverable_after(hit))
            if end <= start:
                break  # no side effects: it stays first in line
            if chunks:  # joining other chunks: only a whole prompt, in a layout the target compiled
                longest = max([e - s for _, s, e in chunks] + [end - start])
                if end < request.num_tokens or not self.prefill_shapes.fits(len(chunks) + 1, longest):
                    break
            self._admit(request, hit)
            assert request.num_computed_tokens == start and self.kv.grow(request.state, end)
            chunks.append((request, start, end))
            budget -= end - start
            if end < request.num_tokens:
                break
        return chunks

    def _chunk_end(self, request: Request, start: int, budget: int, coverable: int) -> int:
        end = min(request.num_tokens, start + min(budget, self.max_chunk), coverable)
        bs = self.pool.block_size
        if end < request.num_tokens and (end // bs) * bs > start:
            end = (end // bs) * bs  # a non-final chunk ends on a block boundary: its blocks commit at once
        return self.snapshots.chunk_end(request, start, end)

    def _admit(self, request: Request, hit: PrefixHit) -> None:
        self.waiting.popleft()
        request.state = self.kv.new_state()
        self.snapshots.claim(hit)  # a snapshot the hit takes from the host tier, before the KV adoption evicts
        cached = self.kv.adopt(request.state, hit) if self.prefix_caching else 0
        for kind, allocator in self.extra_state.items():
            request.state[kind] = allocator.new_allocation()
        request.num_computed_tokens = cached  # the one rule: a prefix hit is computed tokens
        if request.num_preemptions == 0:
            request.cached_tokens = cached  # reported per request: the first admission's prompt hit
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.snapshots.admitted(request, hit)  # its live slots start from the prefix's snapshot, if any

    def _build_step(
        self, decodes: list[Request], chunks: list[tuple[Request, int, int]], preempted: list[str], verifies=()
    ) -> ScheduledStep:
        copies = self.snapshots.step_copies(chunks)
        if self.rollback is not None:  # restores of rolled-back rows, saves of this step's speculating rows
            saves = self.rollback.saves([r for r, _, _ in verifies])
            copies = SlotCopies((*self.rollback.restores(self._running), *copies.before, *saves), copies.after)
        return lay_out_step(self.kv, tuple(self.extra_state), decodes, verifies, chunks, preempted, copies)

    # --- several decode steps in one device call (runtime/scheduling/run_ahead.py) ----------------------
    def extend_decodes(self, step: ScheduledStep, steps: int) -> ScheduledStep | None:
        """Let the just-scheduled decode-only `step` run `steps` decode steps in one call: the step with block
        tables covering every row's next `steps` positions (the engine then calls update_ahead once per decode
        step), or None when it stays a one-step step (RunAhead.extend)."""
        if step is not self._unfinished or step.prefills or step.verifies or step.preempted or steps < 2:
            return None
        if self._speculating():
            return None
        extended = self.run_ahead.extend(step, steps)
        if extended is not None:
            self._unfinished = extended
        return extended

    def _speculating(self) -> bool:
        """Drafts would be taken for some running row: its decode calls are scheduled one step at a time
        (scheduling/speculation.py: no drafts in run-ahead calls)."""
        return plans_drafts(self.draft_source, self.num_speculative_tokens, self.running)

    def chain_decodes(self, step: ScheduledStep, steps: int) -> ScheduledStep | None:
        """The run-ahead step after `step`, still on the device; None when a request waits (RunAhead.chain_decodes)."""
        return None if self.waiting or self._speculating() else self.run_ahead.chain_decodes(step, steps)

    def chain_after_prefill(self, step: ScheduledStep, steps: int) -> ScheduledStep | None:
        """The first run-ahead step behind the just-scheduled `step` (RunAhead.after_prefill); None when `step`
        holds decode rows or a chunk that does not complete, or a request waits to be admitted."""
        if (
            step is not self._unfinished
            or self.run_ahead.pending
            or step.decodes
            or step.preempted
            or not step.prefills
            or self.waiting
            or not all(chunk.completes for chunk in step.prefills)
            or self._speculating()
        ):
            return None
        return self.run_ahead.after_prefill(step, steps)

    def update_ahead(self, step: ScheduledStep, index: int, sampled_token_ids: Sequence[int]) -> list[StepOutput]:
        """update() for decode step `index` (0-based, in order) of the oldest run-ahead step not yet updated:
        each row still running computed position row.position + index and sampled one token; rows that
        finished (or were aborted) at an earlier step or call are skipped — what they computed is discarded."""
        self._unfinished = self.run_ahead.step_at(step, index)
        return self.update(self._unfinished, sampled_token_ids)

    def drop_failed(self, step: ScheduledStep) -> bool:
        """The call of `step`, the oldest run-ahead step not yet updated, failed: forget it without applying
        anything (the engine ends its requests). False if `step` is not that step."""
        if not self.run_ahead.drop_oldest(step):
            return False
        self._unfinished = None
        return True

    def discard_ahead(self, step: ScheduledStep) -> None:
        self.run_ahead.drop_newest(step)  # a chained step whose call will not be applied (the one before failed)

    # --- results ------------------------------------------------------------------------------------
    def update(self, step: ScheduledStep, sampled_token_ids: Sequence[int | Sequence[int]]) -> list[StepOutput]:
        """Apply a step's results: sampled_token_ids holds one entry per step.logit_request_ids entry: a token,
        or for a verify segment the tokens it emitted (its accepted drafts, then the target's own). Tokens after
        one that finishes the request are dropped. Requests aborted or finished between schedule() and update()
        are skipped."""
        if len(sampled_token_ids) != len(step.logit_request_ids):
            raise ValueError(f"{len(sampled_token_ids)} sampled tokens for {len(step.logit_request_ids)} logit rows")
        if step.is_empty:
            return []
        if step is not self._unfinished:
            raise RuntimeError("update() got a step that is not the last one scheduled")
        self._unfinished = None
        self.run_ahead.drop_oldest(step)  # an extended step updated whole (a failed call's placeholder tokens)
        emitted = emitted_by_row(step, sampled_token_ids)
        advanced = [(row.request_id, row.position, 1) for row in step.decodes]
        # a verify segment computed its last known token and the accepted drafts: one per emitted token
        advanced += [(seg.request_id, seg.start, len(emitted[seg.request_id])) for seg in step.verifies]
        advanced += [(chunk.request_id, chunk.start, chunk.num_tokens) for chunk in step.prefills]
        verifying = {seg.request_id: seg for seg in step.verifies}
        for request_id, start, n in advanced:
            request = self._running(request_id)
            if request is None:
                continue
            if request.num_computed_tokens != start:
                raise RuntimeError(
                    f"stale step for {request_id!r}: it starts at {start}, not at {request.num_computed_tokens}"
                )
            request.num_computed_tokens += n
            if request_id not in verifying:  # (a verify row's accepted drafts are committed once appended)
                # commit full blocks to the prefix cache, then drop blocks that fell out of a sliding window
                self.kv.commit(request.state, request.all_token_ids, request.num_computed_tokens)
        self.snapshots.updated(self._running)  # register the step's snapshots (finishing requests' included)
        outputs = []
        for request_id, tokens in emitted.items():
            if (request := self._running(request_id)) is None:
                continue
            taken, status = request.append_until_stop(tokens)  # what it emitted after a stop is dropped
            if request_id in verifying:
                if status is None and self.rollback is not None:
                    self.rollback.settle(request, verifying[request_id])
                settle_verified(self.kv, request)
            if status is not None:
                self._finish(request, status)
            outputs.append(StepOutput(request_id, taken, status.finish_reason if status else None))
        return outputs

    # --- endings ------------------------------------------------------------------------------------
    def abort(self, request_id: str) -> bool:
        """Abort at any state; frees what it owns at once. False if the id is unknown or already finished."""
        return self.finish_request(request_id, RequestStatus.FINISHED_ABORTED)

    def finish_request(self, request_id: str, status: RequestStatus) -> bool:
        """End a request from outside (abort; a stop string the engine found in the detokenized text)."""
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        request = self._active.get(request_id)
        if request is None:
            return False
        self._finish(request, status)
        return True

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
            self._release_state(request)
        else:
            self.waiting.remove(request)  # waiting or preempted requests own nothing
        request.status = status
        del self._active[request.request_id]
        if status is RequestStatus.FINISHED_ABORTED:
            self.num_aborted += 1
        else:
            self.num_finished += 1

    def _release_state(self, request: Request) -> None:
        self.kv.release(request.state)  # every block of every KV kind
        for kind, allocator in self.extra_state.items():
            if kind in request.state:
                allocator.release(request.state[kind])
        request.state = {}
        if self.on_release is not None:
            self.on_release(request.request_id)

    # --- helpers ------------------------------------------------------------------------------------
    def _running(self, request_id: str) -> Request | None:
        request = self._active.get(request_id)
        return request if request is not None and request.status is RequestStatus.RUNNING else None

    def snapshot(self) -> SchedulerSnapshot:
        return snapshot_of(self)
