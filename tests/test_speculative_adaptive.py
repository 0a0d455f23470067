"""Adaptive draft lengths (ember.runtime.speculative.adaptive): the geometric expectation, the per-step plan
under cheap and expensive verify tokens, and the per-request acceptance tracker."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ember.runtime.speculative.adaptive import (
    AcceptanceTracker,
    TrackerConfig,
    expected_tokens,
    plan_draft_lengths,
)


def test_expected_tokens_is_the_geometric_mean_length():
    rng = np.random.default_rng(0)
    for alpha, k in ((0.0, 4), (0.5, 3), (0.9, 8), (1.0, 5)):
        assert expected_tokens(alpha, k) == pytest.approx(sum(alpha**j for j in range(k + 1)))
        survive = rng.random((200_000, k)) < alpha  # simulate: accepted drafts are the leading successes, +1
        simulated = (np.cumprod(survive, axis=1).sum(axis=1) + 1).mean()
        assert simulated == pytest.approx(expected_tokens(alpha, k), rel=0.01)


def constant(seconds):
    return lambda tokens: np.full(np.shape(tokens), seconds, np.float64)


def affine(overhead, per_token):
    return lambda tokens: overhead + per_token * np.asarray(tokens, np.float64)


def rate_of(alphas, ks, step_time):
    """Expected tokens per second of a step whose rows draft ks."""
    tokens = sum(expected_tokens(a, k) for a, k in zip(alphas, ks))
    return tokens / float(step_time(np.array([len(alphas) + sum(ks)]))[0])


def best_rate(alphas, max_drafts, step_time):
    """The best rate over every assignment of draft lengths (exhaustive)."""
    choices = itertools.product(range(max_drafts + 1), repeat=len(alphas))
    return max(rate_of(alphas, ks, step_time) for ks in choices)


def test_free_verify_tokens_draft_to_the_cap_and_full_cost_tokens_draft_nothing():
    alphas = [0.9, 0.5, 0.1]
    assert plan_draft_lengths(alphas, 6, constant(0.01)) == [6, 6, 6]  # memory-bound decode: tokens are free
    assert plan_draft_lengths(alphas, 6, affine(0.0, 0.001)) == [0, 0, 0]  # compute bound: never pays
    assert plan_draft_lengths([0.0, 0.0], 4, constant(0.01)) == [0, 0]  # nothing is ever accepted
    assert plan_draft_lengths([], 4, constant(0.01)) == []
    assert plan_draft_lengths([0.9], 0, constant(0.01)) == [0]


def test_in_between_the_plan_favours_rows_that_accept_more_and_is_optimal():
    step = affine(0.010, 0.0008)  # a fixed cost per step plus a share per token
    alphas = [0.95, 0.6, 0.2]
    ks = plan_draft_lengths(alphas, 4, step)
    assert ks[0] >= ks[1] >= ks[2] and ks[0] > 0 and ks[2] == 0
    assert rate_of(alphas, ks, step) == pytest.approx(best_rate(alphas, 4, step))
    # more rows in the step (load): fewer drafts in all
    loaded = plan_draft_lengths([0.95, 0.6, 0.2] * 20, 4, step)
    assert sum(loaded[:3]) < sum(ks)


def test_draft_cost_lowers_the_draft_lengths():
    step = constant(0.01)
    assert plan_draft_lengths([0.7, 0.7], 8, step, draft_time=affine(0.0, 0.0)) == [8, 8]
    costly = plan_draft_lengths([0.7, 0.7], 8, step, draft_time=affine(0.0, 0.002))
    assert 0 < sum(costly) < 16


def test_tracker_starts_at_its_prior_and_follows_recent_steps():
    tracker = AcceptanceTracker(TrackerConfig(decay=0.5, prior_accepted=2.0, prior_rejected=1.0))
    assert tracker.alpha("r") == pytest.approx(2 / 3)
    tracker.update("r", 4, 4)  # all accepted: no rejection seen
    assert tracker.alpha("r") == pytest.approx((1 + 4) / (1 + 4 + 0.5))
    for _ in range(10):
        tracker.update("r", 4, 0)  # then every first draft is rejected
    assert tracker.alpha("r") < 0.05
    before = tracker.alpha("r")
    tracker.update("r", 0, 0)  # a step without drafts changes nothing
    assert tracker.alpha("r") == before
    tracker.forget("r")
    assert tracker.alpha("r") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="accepted 2 of 1"):
        tracker.update("r", 1, 2)


def test_a_drafting_steps_own_call_must_be_repaid_by_acceptance():
    """Where plain steps run ahead (h200: a drafting step is a device call of its own, +2.1 steps), the verify
    cost model of the h200 (1 + 0.1 per token) drafts only for rows whose acceptance repays the call."""
    step = affine(1.0, 0.1)
    assert plan_draft_lengths([0.7], 4, step) == [4]  # one step per call anyway: drafting pays
    assert plan_draft_lengths([0.7], 4, step, call_overhead=2.1) == [0]  # 2.8 tokens cannot repay 3.5 steps
    assert plan_draft_lengths([0.97], 8, step, call_overhead=2.1) == [8]  # 7.3 tokens for 4.0 steps
    assert plan_draft_lengths([0.97, 0.2], 8, step, call_overhead=2.1)[1] == 0
