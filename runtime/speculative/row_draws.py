"""A host-side drafter's draw for one row, as the request samples (for drafters whose logits are on the host,
such as the MTP drafter): `draft_sample` (compiler/kernels/speculative/reference.py) over the logits with the
row's own settings, seed and step, so the draft and its q are what the verifier expects of a model drafter."""

from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np

from ...compiler.kernels.speculative.reference import draft_sample
from ..execution.engine_step import SUPPRESS_SLOTS, history_bucket
from ..sampling.params import RowState, pack_batch

_DRAW = jax.jit(draft_sample)


def samples(row: RowState | None) -> bool:
    """Whether a row draws at random (a drafter then hands q to the verifier; else it drafts its argmax)."""
    return row is not None and not row.params.is_greedy and row.forced_token is None


def draw_as_row(logits: np.ndarray, row: RowState) -> tuple[int, np.ndarray]:
    """(token, q f32 [V]) from logits f32 [V] through `row`'s pipeline at its step (its grammar left out: q need
    not follow it, the verifier's p does)."""
    rows = [replace(row, matcher=None)]
    batch = pack_batch(rows, vocab_size=len(logits), history_bucket=history_bucket(rows), suppress_slots=SUPPRESS_SLOTS)
    drawn = _DRAW(np.asarray(logits, np.float32)[None], jax.tree.map(jax.numpy.asarray, batch))
    return int(drawn.tokens[0]), np.asarray(drawn.probs[0])
