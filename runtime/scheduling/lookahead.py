"""When the engine may run several decode steps in one device call, and how many.

A device call costs host work whatever its size: scheduling, packing inputs, one transfer each way,
Python around every row's token. On the H200 that work was several times a batch-1 step of the 1.5B model
(docs/results/h200_step_profile_reference.json). When every running request is simply decoding, the
next `steps` steps are known in advance except for the tokens themselves, which the device feeds back
to itself (runtime/execution/engine_step.make_multi_step_fn); the host then pays once per `steps` tokens.

A step may run ahead only if nothing the host decides between tokens can change the next one:
- decode rows only: no prefill chunk, nobody preempted, nobody waiting to be admitted (a waiting
  request would wait `steps` steps longer);
- per row: no grammar (its mask follows each token), no repetition/presence/frequency penalties (they
  read the growing history), no forced tokens, min_tokens no longer in force.
A row may end inside the call (max_tokens, an eos, a stop token or string): what it computes after that
is discarded, as if never computed, and its KV for positions past max_tokens goes to the reserved block 0
(Scheduler.extend_decodes only grows a request's blocks up to its last position). Requiring every row
to have `steps` tokens left instead kept a batch whose requests end one step apart (any batch filled
over time) at one step per call for good (measured: the 8B shape's decode at 256 streams).
Tokens, logprobs and seeds are exactly those of one step at a time: step i of the call samples with
the row's step counter + i, as the i-th single step would.
"""

from __future__ import annotations

from ..sampling.params import RowState
from .scheduled_step import ScheduledStep


def row_can_run_ahead(row: RowState) -> bool:
    p = row.params
    return (
        row.matcher is None
        and p.forced_token_ids is None
        and p.repetition_penalty == 1.0
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
        and row.token_index >= p.min_tokens
    )


def lookahead_steps(step: ScheduledStep, rows: list[RowState], *, steps: int, waiting: int) -> int:
    """How many decode steps the just-scheduled `step` may run in one call: `steps`, or 1.
    rows: one per step.logit_request_ids entry."""
    if steps < 2 or waiting or step.prefills or step.verifies or step.preempted or not step.decodes:
        return 1
    if all(row_can_run_ahead(row) for row in rows):
        return steps
    return 1


def row_can_defer(row: RowState) -> bool:
    """Whether the engine may stream this row's token after dispatching the next device call (runtime/engine/engine.py).
    Streaming advances the row's grammar and its count of generated tokens (which lifts min_tokens'
    suppression); the next call's inputs must not depend on either. Its other inputs (the token, the
    history penalties read, the step counter) come from the scheduler, which has the token by then."""
    return row.matcher is None and row.token_index >= row.params.min_tokens
