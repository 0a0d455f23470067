"""How many tokens each row should draft this step: per-request acceptance, and a step-cost model.

Acceptance: each request's per-token acceptance rate alpha, as exponentially decayed counts of accepted and
rejected draft tokens (`AcceptanceTracker`; a step that accepted a of n drafts saw a acceptances and, if
a < n, one rejection). Under the usual geometric model (each draft accepted with probability alpha, given the
ones before it were), a row with k drafts emits E(k) = (1 - alpha^(k+1)) / (1 - alpha) tokens, and its j-th
draft adds alpha^j: the marginal gains of a row fall with j.

Choice: the step emits sum_r E(k_r) tokens and costs step_time(rows + drafted tokens) + draft_time(drafted
tokens). Taking drafts in order of falling marginal gain (the best row's next draft first), the number of
drafts n that maximises tokens per second is found over every n at once (numpy), and each row keeps its
drafts among the first n. Where a verify token is almost free (a decode step bound by reading the weights),
rows draft up to the cap; where each token costs its full share (a compute-bound step under load), no draft
pays for itself and every k is 0, so speculation never costs aggregate throughput by this model. The step
times come from measurement (the verify cost at k = 1..8 and the step time per bucket).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

StepTime = Callable[[np.ndarray], np.ndarray]  # tokens in the step (i64 [n]) -> seconds (f64 [n])


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a verify step with k drafts emits on average when each draft survives with probability alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def plan_draft_lengths(
    alphas: Sequence[float],
    max_drafts: int,
    step_time: StepTime,
    draft_time: StepTime | None = None,
    call_overhead: float = 0.0,
) -> list[int]:
    """k per row (0..max_drafts) maximising expected tokens per second of the whole step. call_overhead: what a
    step with any draft costs on top of step_time (its own device call where plain steps run ahead)."""
    rows = len(alphas)
    if rows == 0 or max_drafts <= 0:
        return [0] * rows
    alpha = np.clip(np.asarray(alphas, dtype=np.float64), 0.0, 1.0)
    depth = np.arange(1, max_drafts + 1)
    gains = alpha[:, None] ** depth[None, :]  # [R, K]: what the j-th draft of row r adds
    order = np.argsort(-gains, axis=None, kind="stable")  # falling gain; within a row j ascends (gains fall)
    cumulative = np.concatenate([[0.0], np.cumsum(gains.reshape(-1)[order])])  # [R*K + 1]
    drafted = np.arange(rows * max_drafts + 1)
    seconds = step_time(rows + drafted) + (draft_time(drafted) if draft_time is not None else 0.0)
    seconds = seconds + call_overhead * (drafted > 0)
    rate = (rows + cumulative) / seconds
    best = int(np.argmax(rate))  # the first maximum: no draft unless it strictly pays
    ks = np.zeros(rows, dtype=np.int64)
    np.add.at(ks, order[:best] // max_drafts, 1)
    return ks.tolist()


@dataclass(frozen=True)
class TrackerConfig:
    decay: float = 0.8  # weight of the history per step (0: only the last step counts)
    prior_accepted: float = 2.0  # pseudo-counts a new request starts with: alpha = 2 / 3 before any step
    prior_rejected: float = 1.0


class AcceptanceTracker:
    """Per-request decayed counts of accepted and rejected draft tokens, and the alpha they give."""

    def __init__(self, config: TrackerConfig | None = None) -> None:
        self.config = config or TrackerConfig()
        self._counts: dict[str, tuple[float, float]] = {}

    def alpha(self, request_id: str) -> float:
        accepted, rejected = self._counts.get(request_id, (self.config.prior_accepted, self.config.prior_rejected))
        return accepted / (accepted + rejected) if accepted + rejected > 0 else 0.0

    def update(self, request_id: str, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafted tokens")
        if drafted == 0:
            return
        old_accepted, old_rejected = self._counts.get(
            request_id, (self.config.prior_accepted, self.config.prior_rejected)
        )
        decay = self.config.decay
        self._counts[request_id] = (
            decay * old_accepted + accepted,
            decay * old_rejected + (1 if accepted < drafted else 0),
        )

    def forget(self, request_id: str) -> None:
        self._counts.pop(request_id, None)
