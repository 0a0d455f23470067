"""A verify step's sampling rows and results (runtime/scheduling/speculation.py, docs/speculative.md step 2).

Verify row r of a verify step (r < B: decode row r, padding included; then segment s at B + s) has W = L
positions, packed row-major as R * W sampler rows: position i sampled as if the row's first i drafts had been
emitted (`verify_row_states`). A decode row has no drafts: its position 0 is its ordinary sampling row."""

from __future__ import annotations

from dataclasses import replace

from ..sampling.params import RowState
from ..scheduling.scheduled_step import ScheduledStep
from ..speculative.rows import verify_row_states
from .step_inputs import StepShape


def verify_row_batch(step: ScheduledStep, rows: list[RowState], shape: StepShape) -> tuple[list[RowState], dict]:
    """(R * W RowStates, {segment's request id: drafts kept}); rows: one per step.logit_request_ids entry."""
    width, row_of = shape.verify_width, dict(zip(step.logit_request_ids, rows))
    filler = [replace(rows[0], matcher=None)] * width  # padding rows: valid settings, results never read
    flat: list[RowState] = []
    for decode in step.decodes:
        flat += verify_row_states(row_of[decode.request_id], (), width)[0]
    flat += filler * (shape.decode_rows - step.num_decode)
    kept: dict[str, int] = {}
    for segment in step.verifies:
        states, drafts = verify_row_states(row_of[segment.request_id], segment.drafts, width)
        flat += states
        kept[segment.request_id] = len(drafts)
    flat += filler * (shape.segments - len(step.verifies))
    return flat, kept


def verify_results(step: ScheduledStep, shape: StepShape, result, sampled_type) -> dict:
    """{request id: tuple of sampled_type(token, logprob, top ids, top logprobs), one per emitted token}
    from the step's flat results (one per verify row and position; token -1 past what a row emitted)."""
    width = shape.verify_width
    verify_row = {d.request_id: b for b, d in enumerate(step.decodes)}
    verify_row.update({v.request_id: shape.decode_rows + s for s, v in enumerate(step.verifies)})
    out = {}
    for rid, r in verify_row.items():
        emitted = []
        for i in range(r * width, (r + 1) * width):
            if result.tokens[i] < 0:
                break
            emitted.append(
                sampled_type(int(result.tokens[i]), float(result.logprob[i]), result.top_ids[i], result.top_logprobs[i])
            )
        out[rid] = tuple(emitted)
    return out
