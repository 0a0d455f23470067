"""When the engine may run several decode steps in one device call, and how many.

A device call costs host work whatever its size: scheduling, packing inputs, one transfer each way,
Python around every row's token. On the H200 that work was several times a batch-1 step of the 1.5B model
(tools/results/h200_step_profile_reference.json). When every running request is simply decoding, the
next `steps` steps are known in advance except for the tokens themselves, which the device feeds back
to itself (runtime/engine_step.make_multi_step_fn); the host then pays once per `steps` tokens.

A step may run ahead only if nothing the host decides between tokens can change the next one:
- decode rows only: no prefill chunk, nobody preempted, nobody waiting to be admitted (a waiting
  request would wait `steps` steps longer);
- per row: no grammar (its mask follows each token), no repetition/presence/frequency penalties (they
  read the growing history), no forced tokens, min_tokens no longer in force, and at least `steps`
  tokens still allowed by max_tokens (so nothing is computed past a request's end unless it stops early
  on an eos, a stop token or a stop string; those tokens are discarded, as if never computed).
Tokens, logprobs and seeds are exactly those of one step at a time: step i of the call samples with
the row's step counter + i, as the i-th single step would.
"""

from __future__ import annotations

from .sampling_params import RowState
from .step_plan import StepPlan


def row_can_run_ahead(row: RowState, steps: int, max_tokens: int) -> bool:
    p = row.params
    return (row.matcher is None and p.forced_token_ids is None
            and p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
            and row.token_index >= p.min_tokens and max_tokens - row.token_index >= steps)


def lookahead_steps(plan: StepPlan, rows: list[RowState], max_tokens: list[int], *, steps: int,
                    waiting: int) -> int:
    """How many decode steps the just-scheduled `plan` may run in one call: `steps`, or 1.
    rows / max_tokens: one per plan.logit_request_ids entry."""
    if steps < 2 or waiting or plan.prefill is not None or plan.preempted or not plan.decodes:
        return 1
    if all(row_can_run_ahead(row, steps, limit) for row, limit in zip(rows, max_tokens, strict=True)):
        return steps
    return 1
