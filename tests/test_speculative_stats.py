"""Acceptance statistics of speculative decoding (ember.runtime.speculative.stats), counted by hand."""

from __future__ import annotations

import pytest

from ember.runtime.speculative.stats import AcceptanceStats


def test_counts_follow_vllms_spec_decode_metrics():
    stats = AcceptanceStats()
    stats.record(3, 3)  # all accepted: 4 tokens
    stats.record(3, 1)  # one accepted, then the correction: 2 tokens
    stats.record(2, 0)  # none accepted: 1 token
    stats.record(0, 0)  # nothing drafted: a plain step
    assert (stats.steps, stats.emitted_tokens) == (4, 8)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 4)
    assert stats.drafted_per_position == [3, 3, 2]
    assert stats.accepted_per_position == [2, 1, 1]
    assert stats.reached_per_position == [3, 2, 1]  # position 2 of the second draft is never reached
    assert stats.acceptance_rate_per_position() == [2 / 3, 1 / 2, 1.0]
    assert stats.mean_tokens_per_step == 2.0
    assert stats.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert stats.draft_acceptance_rate == 0.5
    assert stats.to_dict()["acceptance_rate_per_position"] == [0.6667, 0.5, 1.0]


def test_merge_equals_recording_everything_in_one():
    steps = [(4, 2), (1, 1), (0, 0), (5, 5), (2, 0)]
    whole, left, right = AcceptanceStats(), AcceptanceStats(), AcceptanceStats()
    for i, (drafted, accepted) in enumerate(steps):
        whole.record(drafted, accepted)
        (left if i % 2 else right).record(drafted, accepted)
    left.merge(right)
    assert left == whole


def test_more_accepted_than_drafted_is_refused():
    with pytest.raises(ValueError, match="accepted 3 of 2"):
        AcceptanceStats().record(2, 3)
    assert AcceptanceStats().to_dict()["mean_acceptance_length"] == 0.0
