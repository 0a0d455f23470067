"""The engine thread (runtime/engine/engine.py's Engine mixes this in): schedule → dispatch → stream, with one device
call in flight while the host streams the previous call's tokens, run-ahead calls chained before their
predecessor's tokens are read, failed calls ending their requests, and an internal error ending them all.
Uses the Engine's scheduler, executor, lock, counters and request maps; the Engine's _stream, _row_state,
_emit and _refuse_stale_waiting."""

from __future__ import annotations

import time
import traceback
from dataclasses import replace

from ..sampling.params import RowState
from ..scheduling.lookahead import lookahead_steps, row_can_defer, row_can_run_ahead


class EngineLoop:
    def _run(self) -> None:
        """The thread's body: _loop, and if it ever raises (an engine bug, not a failed step: _fail_step ends
        those requests and goes on), end every request with the error instead of leaving clients waiting."""
        try:
            self._loop()
        except BaseException as error:  # noqa: BLE001 — whatever it was, nobody may hang on a dead thread
            traceback.print_exception(error)
            with self._lock:
                self.failure = f"{type(error).__name__}: {error}"
                for rid, choice in list(self._choice_of.items()):
                    group = self._group_of.get(rid)
                    if group is None or choice.finish_reason is not None:
                        continue
                    self._emit(
                        group,
                        choice,
                        choice.processor.finish("abort"),
                        error=f"the engine stopped after an internal error: {self.failure}",
                    )

    def _loop(self) -> None:
        # One device call in flight while the host streams the previous call's tokens: after a call's
        # tokens reach the scheduler, the next call is planned and dispatched at once, and only then are
        # the tokens detokenized, checked for stop strings and pushed to their streams (`deferred`).
        # Rows whose next inputs depend on that work (runtime/scheduling/lookahead.py's per-row rules) are streamed
        # before the next plan instead. Requests that end while deferred (a stop string, an abort) may ride
        # in the call already dispatched: what it computes for them is discarded, like run-ahead steps.
        # A run-ahead call is followed, before its results are read, by the next call of the same rows
        # (`chained`, runtime/scheduling/run_ahead.py), so the device never waits for the host between them.
        deferred = None  # (plan, per-step results) not yet streamed
        chained = None  # (plan, rows, steps, collect) dispatched before the previous call's results were read
        while True:
            if chained is not None:
                plan, rows, steps, collect = chained
                chained = None
            else:
                with self._lock:
                    while deferred is None and not self._stopping and not self.scheduler.has_work:
                        self._lock.wait()
                    if self._stopping:
                        if deferred is not None:
                            self._stream(*deferred)
                        return
                    self._refuse_stale_waiting()
                    plan = self.scheduler.schedule()
                    if plan.is_empty:
                        if deferred is not None:
                            self._stream(*deferred)
                            deferred = None
                        else:
                            self._lock.wait(0.01)
                        continue
                    rows = [self._row_state(rid) for rid in plan.logit_request_ids]
                    now = time.monotonic()
                    for rid in plan.block_tables:
                        group = self._group_of.get(rid)
                        if group is not None and group.scheduled_at is None:
                            group.scheduled_at = now
                    steps = self._steps_for(plan, rows)
                    if steps > 1:
                        extended = self.scheduler.extend_decodes(plan, steps)
                        plan, steps = (extended, steps) if extended is not None else (plan, 1)
                try:
                    collect = self.executor.launch(plan, rows, steps)
                except Exception as error:  # a failed step must not strand its requests: end them, go on
                    self._stream_deferred(deferred)
                    deferred = None
                    self._fail_step(plan, error)
                    continue
            if steps > 1 or plan.prefills:
                chained = self._chain(plan, rows, steps)
            self._stream_deferred(deferred)  # host work while the device runs `plan`
            deferred = None
            try:
                per_step = collect()
            except Exception as error:
                self._fail_step(plan, error)
                if chained is not None:
                    self._drop_chained(chained)
                    chained = None
                continue
            with self._lock:
                self.counters.device_calls += 1
                stream_now = not all(row_can_defer(row) for row in rows)
                for step, results in enumerate(per_step):
                    self.counters.steps += 1
                    tokens = [results[rid].token for rid in plan.logit_request_ids]
                    if steps > 1:
                        self.scheduler.update_ahead(plan, step, tokens)
                    else:
                        self.scheduler.update(plan, tokens)
                    if stream_now:
                        self._stream(plan, [results])
                if not stream_now:
                    deferred = (plan, per_step)

    def _chain(self, plan, rows: list[RowState], steps: int):
        """Dispatch the call after `plan` (still on the device) — a run-ahead call, or a step of prefill chunks
        whose requests then decode: (plan, rows, steps, collect), or None when the scheduler or the rows say
        the host must look at `plan`'s tokens first."""
        # the rows' step counters (seeded sampling) continue where `plan`'s steps end
        nxt_rows = [replace(row, step=row.token_index + steps) for row in rows]
        if steps == 1:  # a prefill step: its rows' next token must be one that may run ahead
            steps = self.executor.decode_steps
            if steps < 2 or not all(row_can_run_ahead(row) for row in nxt_rows):
                return None
        # a run-ahead call's rows already passed lookahead_steps (no grammar, penalties, forced tokens or
        # min_tokens in force), and a row that did keeps passing: only the scheduler can say no
        with self._lock:
            if self._stopping:
                return None
            nxt = (
                self.scheduler.chain_decodes(plan, steps)
                if not plan.prefills
                else self.scheduler.chain_after_prefill(plan, steps)
            )
            if nxt is None:
                return None
        try:
            collect = self.executor.launch(nxt, nxt_rows, steps, chained=True)
        except Exception as error:  # not fatal: drop the chained plan, the next call is planned as usual
            traceback.print_exception(error)
            with self._lock:
                self.scheduler.discard_ahead(nxt)
            return None
        self.counters.chained_calls += 1
        return nxt, nxt_rows, steps, collect

    def _drop_chained(self, chained) -> None:
        """The call before `chained` failed: wait for the chained call (its inputs were that call's tokens) and
        drop it unapplied; its requests were ended with the failed call."""
        plan, _, _, collect = chained
        try:
            collect()
        except Exception:  # noqa: BLE001 — its inputs came from the failed call: any error is that one
            pass
        with self._lock:
            self.scheduler.discard_ahead(plan)

    def _stream_deferred(self, deferred) -> None:
        if deferred is not None:
            with self._lock:
                self._stream(*deferred)

    def _steps_for(self, plan, rows: list[RowState]) -> int:
        return lookahead_steps(plan, rows, steps=self.executor.decode_steps, waiting=len(self.scheduler.waiting))

    def _fail_step(self, plan, error: Exception) -> None:
        traceback.print_exception(error)
        with self._lock:
            if not self.scheduler.drop_failed(plan):  # a run-ahead plan is dropped, a step gets placeholder tokens
                self.scheduler.update(plan, [0] * len(plan.logit_request_ids))  # (keeps schedule/update paired)
            for rid in plan.block_tables:
                group, choice = self._group_of.get(rid), self._choice_of.get(rid)
                if group is None or choice is None or choice.finish_reason is not None:
                    continue
                self.scheduler.abort(rid)
                self._emit(group, choice, choice.processor.finish("abort"), error=f"{type(error).__name__}: {error}")
