"""What the gated_delta kernel tests share: the StepBatch of a step's layout (B decode rows, P prefill segments)."""

from __future__ import annotations

import jax.numpy as jnp

from ember.compiler.batch import StepBatch


def step_batch(positions, slots, layout) -> StepBatch:
    """The fields gated_delta reads: positions [N], the state slots [1, N], and the layout (B, P, L) in the shapes
    of the decode context lengths [B] and the prefill block table [1, P, 1]."""
    b, p, _ = layout
    return StepBatch(
        tokens=None,
        positions=jnp.asarray(positions, jnp.int32),
        slots=None,
        dec_block_tables=None,
        dec_ctx_lens=jnp.ones(b, jnp.int32),
        pre_block_table=jnp.zeros((1, p, 1), jnp.int32),
        logit_rows=None,
        state_slots=jnp.asarray(slots, jnp.int32)[None],
    )
