"""The drafter interface: what every source of draft tokens (n-gram lookup, predicted outputs, a draft model,
an MTP module, an EAGLE-style head) gives the verifier.

A drafter sees one request's token context (`DraftContext`) and proposes up to k next tokens (`Draft`).
Drafters that draw their tokens from a distribution (a model drafter sampling at the request's temperature)
also return the rows of that distribution, one per drafted token: rejection sampling needs q_i(d_i) and, on
rejection, all of q_i. Drafters without probabilities (lookup) return none and are verified as point masses.
A draft may be shorter than k, or empty (nothing to propose: the row decodes plainly this step).

Model drafters keep per-request state on the device (their own paged KV); they key it by `request_id` and
learn what was accepted from the context they are next shown (its tokens past what they drafted from).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..sampling.params import RowState


@dataclass(frozen=True)
class DraftContext:
    """One sequence about to be drafted for: its prompt, what it emitted, and an optional predicted output.

    prediction_ids: the token ids of the request's Predicted Output (OpenAI `prediction: {"type": "content"}`),
    tokenized with the request's tokenizer, or () when it has none.
    row: the row's sampling state (its settings, seed and step) for drafters that sample as the request does,
    or None (a drafter then drafts deterministically).
    """

    request_id: str
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    prediction_ids: Sequence[int] = ()
    row: RowState | None = field(default=None, compare=False)

    @property
    def tokens(self) -> np.ndarray:
        """prompt + output as one i64 array (what lookup drafters search)."""
        return np.asarray([*self.prompt_ids, *self.output_ids], dtype=np.int64)


@dataclass(frozen=True)
class Draft:
    """Up to k proposed next tokens, and (model drafters only) the distribution each was drawn from.

    probs: f32 [len(token_ids), V], row i = q_i (sums to 1, q_i[token_ids[i]] > 0), or None for a point mass.
    """

    token_ids: tuple[int, ...] = ()
    probs: np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.probs is not None and (self.probs.ndim != 2 or self.probs.shape[0] != len(self.token_ids)):
            raise ValueError(
                f"probs: expected one row per drafted token ({len(self.token_ids)}), got shape {self.probs.shape}"
            )

    def __len__(self) -> int:
        return len(self.token_ids)


def draft_context(request, row_state=None) -> DraftContext:
    """The DraftContext of a scheduler request (request_id, prompt_token_ids, output_token_ids,
    prediction_ids); row_state: request id -> its RowState, or None (drafters then draft deterministically)."""
    row = row_state(request.request_id) if row_state is not None else None
    return DraftContext(
        request.request_id, request.prompt_token_ids, request.output_token_ids, request.prediction_ids, row
    )


@runtime_checkable
class Drafter(Protocol):
    """Anything that proposes draft tokens for a sequence."""

    def propose(self, context: DraftContext, k: int) -> Draft:
        """At most k (k >= 0) tokens to follow context's prompt + output; never raises for "nothing found"."""
        ...

    def release(self, request_id: str) -> None:
        """The request finished or was preempted: drop whatever state is kept for it (lookup keeps none)."""
        ...
