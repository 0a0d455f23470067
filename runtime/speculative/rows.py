"""The sampling state of each verify position of a row: what `pack_batch` packs for the verifier.

Position i of a row with drafts d_0..d_{n-1} is sampled as if d_0..d_{i-1} had been emitted: its output (the
penalties' history) ends with them, its step is the row's step + i (min_tokens, forced tokens, the seed
stream), and its grammar matcher has consumed them. A draft the grammar refuses ends the draft there (the
verifier would reject it; positions after it cannot be reached), so the kept drafts come back with the states.
Positions past the kept drafts, up to the step's width K + 1, repeat the last real position's state without
its grammar: they are padding, their results are never read (num_drafts masks them), but their settings must
be valid (an unconstrained mask is, and costs no grammar work).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ember.runtime.sampling.params import RowState


def verify_row_states(row: RowState, drafts: Sequence[int], width: int) -> tuple[list[RowState], tuple[int, ...]]:
    """(width RowStates, the drafts kept) for one row of a verify step of width K + 1 (width >= 1)."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    kept = [int(d) for d in drafts][: width - 1]
    if row.params.forced_token_ids is not None:
        kept = []  # teacher-forced rows emit their given tokens one step at a time
    matchers = [row.matcher]
    if row.matcher is not None:
        for i, token in enumerate(kept):
            advanced = matchers[-1].copy()  # the row's own matcher is advanced by the engine after the step
            if advanced.accept(token) is not None:
                kept = kept[:i]
                break
            matchers.append(advanced)
    base = row.token_index
    states = [
        replace(
            row, output_ids=(*row.output_ids, *kept[:i]), step=base + i, matcher=matchers[i] if row.matcher else None
        )
        for i in range(len(kept) + 1)
    ]
    states += [replace(states[-1], matcher=None)] * (width - len(states))
    return states, tuple(kept)
