"""The engine thread: schedule → launch the step on its bucket's executable → collect → update the requests,
with one device call in flight while the host streams the previous call's tokens, run-ahead calls chained
before their predecessor's tokens are read, failed calls ending their requests, and an internal error ending
them all.

The loop owns no state of its own beyond the thread: it is handed the Scheduler, the StepExecutor, the
OpenRequests (sampling state in, sampled tokens out) and the lock the Engine's API shares with it.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import replace

from ..execution.step_executor import InFlightStep, StepExecutor
from ..sampling.params import RowState
from ..scheduling.lookahead import lookahead_steps, row_can_defer, row_can_run_ahead
from ..scheduling.scheduled_step import ScheduledStep
from ..scheduling.scheduler import Scheduler
from .open_requests import EngineCounters, OpenRequests

# a call's results collected but not streamed yet: (its step, one {request id: Sampled} per decode step)
Deferred = tuple[ScheduledStep, list]


class EngineLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        executor: StepExecutor,
        requests: OpenRequests,
        counters: EngineCounters,
        lock: threading.Condition,
        max_queue_wait_s: float,
    ):
        self.scheduler, self.executor, self.requests, self.counters = scheduler, executor, requests, counters
        self._lock = lock  # the Engine's: held for every change to the scheduler or the requests
        self.max_queue_wait_s = max_queue_wait_s
        self.failure: str | None = None  # set when the thread died (the Engine refuses new requests)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ember-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stream what was collected, then end the thread (requests still running stay unfinished); timeout: stop
        waiting for a thread that may never return (stuck in a device call of a broken process group)."""
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join(timeout)

    def halt(self) -> None:
        """Stop scheduling for good (the caller holds the lock): a broken process group runs no more steps."""
        self._stopping = True
        self._lock.notify()

    def _run(self) -> None:
        """The thread's body: _loop, and if it ever raises (an engine bug, not a failed step: _fail ends those
        requests and goes on), end every request with the error instead of leaving clients waiting."""
        try:
            self._loop()
        except BaseException as error:  # noqa: BLE001 — whatever it was, nobody may hang on a dead thread
            traceback.print_exception(error)
            with self._lock:
                self.failure = f"{type(error).__name__}: {error}"
                self.requests.fail_all(f"the engine stopped after an internal error: {self.failure}")

    def _loop(self) -> None:
        # One device call in flight while the host streams the previous call's tokens: after a call's
        # tokens reach the scheduler, the next call is scheduled and launched at once, and only then are
        # the tokens detokenized, checked for stop strings and pushed to their streams (`deferred`).
        # Rows whose next inputs depend on that work (runtime/scheduling/lookahead.py's per-row rules) are
        # streamed before the next step instead. Requests that end while deferred (a stop string, an abort)
        # may ride in the call already launched: what it computes for them is discarded, like run-ahead steps.
        # A run-ahead call is followed, before its results are read, by the next call of the same rows
        # (`chained`, runtime/scheduling/run_ahead.py), so the device never waits for the host between them.
        deferred: Deferred | None = None
        chained: InFlightStep | None = None  # launched before the previous call's results were read
        while True:
            if chained is not None:
                in_flight, chained = chained, None
            else:
                with self._lock:
                    scheduled = self._schedule(deferred)
                if scheduled is None:  # stopping, or nothing to run (`deferred` was streamed)
                    if self._stopping:
                        return
                    deferred = None
                    continue
                step, rows, steps = scheduled
                try:
                    in_flight = self.executor.launch(step, rows, steps)  # on the executable of step's bucket
                except Exception as error:  # a failed step must not strand its requests: end them, go on
                    self._stream(deferred)
                    deferred = None
                    self._fail(step, error)
                    continue
            if in_flight.steps > 1 or in_flight.step.prefills:
                chained = self._chain(in_flight)
            self._stream(deferred)  # host work while the device runs `in_flight`
            deferred = None
            try:
                per_step = self.executor.collect(in_flight)
            except Exception as error:
                self._fail(in_flight.step, error)
                if chained is not None:
                    self._drop_chained(chained)
                    chained = None
                continue
            deferred = self._update(in_flight, per_step)

    def _schedule(self, deferred: Deferred | None) -> tuple[ScheduledStep, list[RowState], int] | None:
        """Wait for work, then the next step, its rows' sampling state and its decode steps (several when it may
        run ahead); None when stopping or when there is nothing to run (after streaming `deferred`, or a short
        wait). The caller holds the lock."""
        while deferred is None and not self._stopping and not self.scheduler.has_work:
            self._lock.wait()
        if self._stopping:
            self._stream_locked(deferred)
            return None
        self.requests.refuse_stale_waiting(self.max_queue_wait_s)
        step = self.scheduler.schedule()
        if step.is_empty:
            if deferred is not None:
                self._stream_locked(deferred)
            else:
                self._lock.wait(0.01)
            return None
        rows = self.requests.row_states(step)
        self.requests.mark_scheduled(step)
        steps = lookahead_steps(step, rows, steps=self.executor.decode_steps, waiting=len(self.scheduler.waiting))
        if steps > 1:
            extended = self.scheduler.extend_decodes(step, steps)
            step, steps = (extended, steps) if extended is not None else (step, 1)
        return step, rows, steps

    def _update(self, in_flight: InFlightStep, per_step: list) -> Deferred | None:
        """Feed a collected call's tokens to the scheduler, one decode step at a time; stream them now, or return
        them to stream once the next call is launched (when no row's next inputs depend on streaming)."""
        step = in_flight.step
        with self._lock:
            self.counters.device_calls += 1
            stream_now = not all(row_can_defer(row) for row in in_flight.rows)
            for index, results in enumerate(per_step):
                self.counters.steps += 1
                tokens = [_tokens(results[rid]) for rid in step.logit_request_ids]
                if in_flight.num_drafts is not None:
                    self.requests.record_verified(in_flight.num_drafts, results)
                if in_flight.steps > 1:
                    self.scheduler.update_ahead(step, index, tokens)
                else:
                    self.scheduler.update(step, tokens)
                if stream_now:
                    self.requests.stream(step, [results])
        return None if stream_now else (step, per_step)

    def _chain(self, in_flight: InFlightStep) -> InFlightStep | None:
        """Launch the call after `in_flight` (still on the device) — a run-ahead call, or the first one after a
        step of prefill chunks whose requests then decode; None when the scheduler or the rows say the host
        must look at `in_flight`'s tokens first."""
        step, steps = in_flight.step, in_flight.steps
        # the rows' step counters (seeded sampling) continue where `in_flight`'s steps end
        rows = [replace(row, step=row.token_index + steps) for row in in_flight.rows]
        if steps == 1:  # a prefill step: its rows' next token must be one that may run ahead
            steps = self.executor.decode_steps
            if steps < 2 or not all(row_can_run_ahead(row) for row in rows):
                return None
        # a run-ahead call's rows already passed lookahead_steps (no grammar, penalties, forced tokens or
        # min_tokens in force), and a row that did keeps passing: only the scheduler can say no
        with self._lock:
            if self._stopping:
                return None
            nxt = (
                self.scheduler.chain_decodes(step, steps)
                if not step.prefills
                else self.scheduler.chain_after_prefill(step, steps)
            )
            if nxt is None:
                return None
        try:
            chained = self.executor.launch(nxt, rows, steps, after=in_flight)
        except Exception as error:  # not fatal: drop the chained step, the next call is scheduled as usual
            traceback.print_exception(error)
            with self._lock:
                self.scheduler.discard_ahead(nxt)
            return None
        self.counters.chained_calls += 1
        return chained

    def _drop_chained(self, chained: InFlightStep) -> None:
        """The call before `chained` failed: wait for the chained call (its inputs were that call's tokens) and
        drop it unapplied; its requests were ended with the failed call."""
        try:
            self.executor.collect(chained)
        except Exception:  # noqa: BLE001 — its inputs came from the failed call: any error is that one
            pass
        with self._lock:
            self.scheduler.discard_ahead(chained.step)

    def _stream(self, deferred: Deferred | None) -> None:
        if deferred is not None:
            with self._lock:
                self.requests.stream(*deferred)

    def _stream_locked(self, deferred: Deferred | None) -> None:
        if deferred is not None:
            self.requests.stream(*deferred)

    def _fail(self, step: ScheduledStep, error: Exception) -> None:
        traceback.print_exception(error)
        with self._lock:
            if not self.scheduler.drop_failed(step):  # a run-ahead step is dropped, a step gets placeholder tokens
                self.scheduler.update(step, [0] * len(step.logit_request_ids))  # (keeps schedule/update paired)
            self.requests.fail(step, f"{type(error).__name__}: {error}")


def _tokens(sampled) -> int | tuple[int, ...]:
    """A row's token, or a verify row's emitted tokens (a tuple of Sampled)."""
    return tuple(s.token for s in sampled) if isinstance(sampled, tuple) else sampled.token
