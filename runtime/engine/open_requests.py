"""The requests the engine holds open: each submitted request (a group of n choices), its output processors and
stream, and the scheduler ids of its choices. The engine loop hands it each call's sampled tokens (stream) and
asks it for the rows' sampling state (row_states); the Engine's API adds and aborts requests. Every method runs
under the engine's lock (the caller holds it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..sampling.guided import GuidedMatcher
from ..sampling.params import RowState, SamplingParams
from ..scheduling.requests import Request, RequestStatus
from ..scheduling.scheduled_step import ScheduledStep
from ..scheduling.scheduler import Scheduler
from ..speculative.stats import AcceptanceStats
from .output_processor import OutputProcessor, merge_deltas
from .streams import RequestOutput, RequestStream, TokenLogprob, Usage


@dataclass
class EngineCounters:
    requests_finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    device_calls: int = 0  # steps run ahead several at a time count once here (runtime/scheduling/lookahead.py)
    chained_calls: int = 0  # of those, dispatched before the previous call's results were read
    speculation: AcceptanceStats = field(default_factory=AcceptanceStats)  # verify segments' drafts


@dataclass
class Choice:
    index: int
    request: Request
    processor: OutputProcessor
    seed: int
    finish_reason: str | None = None
    matcher: GuidedMatcher | None = None  # params.guided: the grammar's state, advanced by each token
    accepted_drafts: int = 0  # drafted tokens its verify steps accepted (Predicted Outputs' usage)
    rejected_drafts: int = 0


@dataclass
class RequestGroup:
    request_id: str
    stream: RequestStream
    params: SamplingParams
    choices: list[Choice]
    arrival: float
    scheduled_at: float | None = None
    first_token_at: float | None = None


class OpenRequests:
    def __init__(self, scheduler: Scheduler, counters: EngineCounters):
        self.scheduler, self.counters = scheduler, counters
        self.groups: dict[str, RequestGroup] = {}  # by the caller's request id
        self._choice_of: dict[str, Choice] = {}  # scheduler request id -> choice
        self._group_of: dict[str, RequestGroup] = {}

    def add(self, group: RequestGroup) -> None:
        """Queue every choice of a new request with the scheduler (all or none: a refusal raises)."""
        if group.request_id in self.groups:
            raise ValueError(f"request id {group.request_id!r} is already in use")
        added = []
        try:
            for choice in group.choices:
                self.scheduler.add(choice.request)
                added.append(choice)
        except Exception:
            for choice in added:
                self.scheduler.abort(choice.request.request_id)
            raise
        self.groups[group.request_id] = group
        for choice in group.choices:
            self._choice_of[choice.request.request_id] = choice
            self._group_of[choice.request.request_id] = group

    def abort(self, request_id: str) -> bool:
        """End a request's unfinished choices now; False for an unknown (or already closed) request."""
        group = self.groups.get(request_id)
        if group is None:
            return False
        for choice in group.choices:
            if choice.finish_reason is None:
                self.scheduler.abort(choice.request.request_id)
                self._emit(group, choice, choice.processor.finish("abort"))
        return True

    # ---- what the engine loop asks --------------------------------------------------------------------

    def row_states(self, step: ScheduledStep) -> list[RowState]:
        """The sampling state of each row whose logits `step` samples (one per step.logit_request_ids entry)."""
        return [self.row_state(rid) for rid in step.logit_request_ids]

    def mark_scheduled(self, step: ScheduledStep) -> None:
        """Its first scheduled step ends a request's time in the queue (Usage.queue_s)."""
        now = time.monotonic()
        for rid in step.block_tables:
            group = self._group_of.get(rid)
            if group is not None and group.scheduled_at is None:
                group.scheduled_at = now

    def stream(self, step: ScheduledStep, per_step: list) -> None:
        """Hand the steps' tokens to their choices, one output per choice for all the steps (a device call's
        tokens arrive together: one stream push each, not one per token)."""
        for rid in step.logit_request_ids:
            choice = self._choice_of.get(rid)
            if choice is None or choice.finish_reason is not None:
                continue  # aborted while the step ran, or finished at an earlier step
            samples = [results[rid] for results in per_step]  # a verify step's: a tuple per step
            self._advance(rid, choice, [s for one in samples for s in (one if isinstance(one, tuple) else (one,))])

    def record_verified(self, num_drafts: dict[str, int], results: dict) -> None:
        """A verify step's drafts per segment and what its rows emitted (accepted drafts + 1)."""
        for rid, drafted in num_drafts.items():
            accepted = len(results[rid]) - 1
            self.counters.speculation.record(drafted, accepted)
            choice = self._choice_of.get(rid)
            if choice is not None:
                choice.accepted_drafts += accepted
                choice.rejected_drafts += drafted - accepted

    def fail(self, step: ScheduledStep, error: str) -> None:
        """The call of `step` failed: end every request in it with the error."""
        for rid in step.block_tables:
            group, choice = self._group_of.get(rid), self._choice_of.get(rid)
            if group is None or choice is None or choice.finish_reason is not None:
                continue
            self.scheduler.abort(rid)
            self._emit(group, choice, choice.processor.finish("abort"), error=error)

    def fail_all(self, error: str) -> None:
        """The engine thread died: end every open request with the error."""
        for rid, choice in list(self._choice_of.items()):
            group = self._group_of.get(rid)
            if group is None or choice.finish_reason is not None:
                continue
            self._emit(group, choice, choice.processor.finish("abort"), error=error)

    def refuse_stale_waiting(self, max_queue_wait_s: float) -> None:
        """The bounded wait for KV capacity: a request never admitted within max_queue_wait_s ends."""
        deadline = time.monotonic() - max_queue_wait_s
        for request in list(self.scheduler.waiting):
            group = self._group_of.get(request.request_id)
            short_of_kv = not self.scheduler.kv.has_room_for(request.num_prompt_tokens)
            if group is not None and group.scheduled_at is None and group.arrival < deadline and short_of_kv:
                for choice in group.choices:
                    if choice.finish_reason is None:
                        self.scheduler.abort(choice.request.request_id)
                        delta = choice.processor.finish("abort")
                        self._emit(group, choice, delta)

    # ---- output processing -----------------------------------------------------------------------------

    def _advance(self, rid: str, choice: Choice, samples: list) -> None:
        """Stream a choice's sampled tokens (one per step, in order) as one output; a choice following a
        grammar also advances it, and ends when it does."""
        group = self._group_of[rid]
        deltas = []
        for sampled in samples:
            if choice.matcher is not None:
                try:
                    error = choice.matcher.accept(sampled.token)
                except Exception as exc:  # a matcher failure ends its choice, never the engine thread
                    error = f"{type(exc).__name__}: {exc}"
                if error is not None:
                    if deltas:
                        self._emit(group, choice, merge_deltas(deltas))
                    self.scheduler.abort(rid)
                    self._emit(group, choice, choice.processor.finish("abort"), error=f"grammar: {error}")
                    return
            deltas.append(choice.processor.push(sampled.token, self._logprob(choice, sampled)))
            if deltas[-1].finished:
                break
            if choice.matcher is not None and choice.matcher.finished:
                deltas.append(choice.processor.finish("stop"))  # the output is complete
                break
        self._emit(group, choice, merge_deltas(deltas))

    def row_state(self, scheduler_id: str) -> RowState:
        choice = self._choice_of[scheduler_id]
        request = choice.request
        return RowState(
            request.params,
            choice.seed,
            request.prompt_token_ids,
            request.output_token_ids,
            choice.processor.suppressed_token_ids(),
            matcher=choice.matcher,
        )

    @staticmethod
    def _logprob(choice: Choice, sampled) -> TokenLogprob | None:
        k = choice.request.params.logprobs
        if k is None:
            return None
        top = tuple((int(i), float(lp)) for i, lp in zip(sampled.top_ids[:k], sampled.top_logprobs[:k]))
        return TokenLogprob(int(sampled.token), float(sampled.logprob), top)

    def _emit(self, group: RequestGroup, choice: Choice, delta, error: str | None = None) -> None:
        now = time.monotonic()
        if delta.token_ids and group.first_token_at is None:
            group.first_token_at = now
        if delta.finish_reason is not None and choice.finish_reason is None:
            choice.finish_reason = delta.finish_reason
            if choice.request.status is RequestStatus.RUNNING or not choice.request.is_finished:
                status = {"stop": RequestStatus.FINISHED_STOPPED, "length": RequestStatus.FINISHED_LENGTH}.get(
                    delta.finish_reason, RequestStatus.FINISHED_ABORTED
                )
                self.scheduler.finish_request(choice.request.request_id, status)
            self.counters.generation_tokens += choice.processor.num_output_tokens
            self.counters.requests_finished[delta.finish_reason] = (
                self.counters.requests_finished.get(delta.finish_reason, 0) + 1
            )
        usage = None
        if all(c.finish_reason is not None for c in group.choices):
            usage = self._close_group(group, now)
        if delta.text or delta.token_ids or delta.finish_reason is not None or usage is not None:
            group.stream.push(
                RequestOutput(
                    group.request_id,
                    choice.index,
                    delta.text,
                    tuple(delta.token_ids),
                    tuple(delta.logprobs) if delta.logprobs is not None else None,
                    delta.finish_reason,
                    delta.stop_reason,
                    usage,
                    error,
                )
            )

    def _close_group(self, group: RequestGroup, now: float) -> Usage:
        del self.groups[group.request_id]
        for choice in group.choices:
            self._choice_of.pop(choice.request.request_id, None)
            self._group_of.pop(choice.request.request_id, None)
        prompt = group.choices[0].request.num_prompt_tokens
        self.counters.prompt_tokens += prompt
        first = group.first_token_at or now
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=sum(c.processor.num_output_tokens for c in group.choices),
            cached_tokens=max(c.request.cached_tokens for c in group.choices),
            queue_s=(group.scheduled_at or now) - group.arrival,
            ttft_s=first - group.arrival,
            decode_s=now - first,
            e2e_s=now - group.arrival,
            **_prediction_usage(group),
        )


def _prediction_usage(group: RequestGroup) -> dict:
    """Usage's Predicted Outputs counts: the drafts of a request that carried a prediction (the n-gram drafter
    drafts from it first), accepted and rejected, over its choices."""
    if not group.choices[0].request.prediction_ids:
        return {}
    return {
        "accepted_prediction_tokens": sum(c.accepted_drafts for c in group.choices),
        "rejected_prediction_tokens": sum(c.rejected_drafts for c in group.choices),
    }
