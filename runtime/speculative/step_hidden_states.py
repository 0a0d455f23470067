"""The target's hidden states as the engine's steps computed them: a `TargetHiddenStates` (mtp_drafter.py) with
no target pass of its own.

The executor hands every collected step's hidden states [N, d] to `record` (runtime/execution/step_hidden.py
says which rows are whose); each request keeps one row per position, written where a step computed that
position. A position computed again (a rejected draft's, a hybrid's recomputed chunk) is overwritten, and the
drafter only reads positions below the request's computed count, which hold the accepted tokens' states.

Positions the target never computed for this request (a prompt prefix served from the prefix cache) read as
zeros: the MTP drafts from less context there (drafts are verified, so the output is unchanged).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..execution.step_hidden import split_rows
from ..execution.step_inputs import StepShape
from ..scheduling.scheduled_step import ScheduledStep


class StepHiddenStates:
    def __init__(self, width: int):
        self.width = width
        self.rows: dict[str, np.ndarray] = {}  # request id -> float32 [capacity, d], by position

    def record(self, step: ScheduledStep, shape: StepShape, hidden: np.ndarray) -> None:
        """Keep the hidden states a step returned (hidden [N, d]: every row of its batch)."""
        for rid, start, states in split_rows(step, shape, hidden):
            self._write(rid, start, states)

    def __call__(self, request_id: str, tokens: Sequence[int]) -> np.ndarray:
        """float32 [len(tokens), d]: the states at positions 0 .. len(tokens) - 1 (zeros where none was computed)."""
        count = len(tokens)
        kept = self.rows.get(request_id)
        out = np.zeros((count, self.width), np.float32)
        if kept is not None:
            have = min(count, len(kept))
            out[:have] = kept[:have]
        return out

    def release(self, request_id: str) -> None:
        self.rows.pop(request_id, None)

    def _write(self, rid: str, start: int, states: np.ndarray) -> None:
        end = start + len(states)
        kept = self.rows.get(rid)
        if kept is None or len(kept) < end:
            grown = np.zeros((max(end, 2 * (0 if kept is None else len(kept)), 16), self.width), np.float32)
            if kept is not None:
                grown[: len(kept)] = kept
            kept = self.rows[rid] = grown
        kept[start:end] = states
