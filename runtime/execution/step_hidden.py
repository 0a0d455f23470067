"""A step's final-norm hidden states beside its logits, for drafters that read the target's own hidden states
(the MTP drafter, docs/speculative.md "The MTP drafter"): the verify / decode / prefill step that computes a
token also returns its hidden state, so drafting needs no second target pass.

Every generated plan's `forward` is the same loop (compiler/codegen: prologue, each layer's body from
LAYER_BODIES, epilogue), and every epilogue ends `h = final_norm(x_in[logit_rows]); logits = linear(h,
output.weight)`. `forward_with_hidden` runs that loop and calls the epilogue twice on the last layer's output:
once as the plan does (the logits), once over every row with `output.weight` swapped for the identity (the
hidden states, the same code `hidden_states.hidden_state_model` runs for embeddings).
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from ..scheduling.scheduled_step import ScheduledStep
from .hidden_states import OUTPUT_WEIGHT
from .step_inputs import StepShape


def forward_with_hidden(module) -> Callable:
    """(dims, params, state, batch) -> (logits [R, vocab], hidden [N, d] of every row of the batch, new state)."""

    def forward(dims, params, state, batch):
        x = module.prologue(dims, params.globals, batch)
        x_add = None
        new_state = []
        for index in range(dims.layers):
            layer = module.LAYER_BODIES[dims.layer_bodies[index]]
            x, x_add, layer_state = layer(
                dims, params.layers[index], params.constants[index], x, x_add, state[index], batch
            )
            new_state.append(layer_state)
        logits = module.epilogue(dims, params.globals, x, x_add, batch)
        rows = batch.tokens.shape[0]
        identity = jnp.eye(int(dims.d), dtype=x.dtype)
        every_row = batch._replace(logit_rows=jnp.arange(rows, dtype=jnp.int32))
        hidden = module.epilogue(dims, {**params.globals, OUTPUT_WEIGHT: identity}, x, x_add, every_row)
        return logits, hidden, new_state

    return forward


def computed_rows(step: ScheduledStep, shape: StepShape) -> list[tuple[str, int, int, int]]:
    """(request id, first position, first row, rows) per run of rows of the step that computed one request's
    consecutive positions (build_step_batch's layout: decode row b at row b, segment s at B + s * L)."""
    runs = [(d.request_id, int(p), b, 1) for b, (d, p) in enumerate(zip(step.decodes, step.decode_positions()))]
    length = shape.segment_tokens
    for s, segment in enumerate(step.segments):
        runs.append((segment.request_id, segment.start, shape.decode_rows + s * length, segment.num_tokens))
    return runs


def split_rows(step: ScheduledStep, shape: StepShape, hidden: np.ndarray) -> list[tuple[str, int, np.ndarray]]:
    """(request id, first position, hidden [n, d]) per computed run of the step."""
    return [(rid, start, hidden[lo : lo + n]) for rid, start, lo, n in computed_rows(step, shape)]
