"""Draft sources of speculative decoding (ember.runtime.speculative): the drafter interface, prompt lookup
(n-gram) and OpenAI Predicted Outputs, against a brute-force search written out plainly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ember.runtime.speculative.drafter import Draft, DraftContext, Drafter
from ember.runtime.speculative.ngram import NgramConfig, NgramDrafter, lookup_continuation


def context(prompt, output=(), prediction=()):
    return DraftContext("req", tuple(prompt), tuple(output), tuple(prediction))


def brute_force(tokens, min_match, max_match, k):
    """The rule, spelled out: longest suffix match (capped at max_match, >= min_match), then the latest."""
    best_len, best_end = 0, None
    for end in range(len(tokens) - 1):  # the match must leave at least one following token
        length = 0
        while length < max_match and end - length >= 0 and tokens[end - length] == tokens[-1 - length]:
            length += 1
        if length >= min_match and length >= best_len:
            best_len, best_end = length, end
    return [] if best_end is None or k <= 0 else list(tokens[best_end + 1 : best_end + 1 + k])


def test_ngram_drafter_is_a_drafter_and_copies_what_followed_the_match():
    drafter = NgramDrafter(NgramConfig(min_match=2, max_match=3, max_drafts=4))
    assert isinstance(drafter, Drafter)
    # "def f ( x ) : return x" ... then "def f (" again: the draft is what followed it the first time
    prompt = [10, 11, 12, 13, 14, 15, 16, 13, 99, 10, 11, 12]
    assert drafter.propose(context(prompt), 8).token_ids == (13, 14, 15, 16)  # capped by max_drafts
    assert drafter.propose(context(prompt), 2).token_ids == (13, 14)
    assert drafter.propose(context(prompt), 0) == Draft()
    # the output counts as much as the prompt
    assert drafter.propose(context(prompt[:9], [10, 11, 12]), 3).token_ids == (13, 14, 15)


def test_longest_match_wins_over_a_more_recent_shorter_one():
    config = NgramConfig(min_match=1, max_match=3)
    tokens = np.array([1, 2, 3, 7, 8, 9, 5, 3, 4, 1, 2, 3])  # "2 3" at 1..2 (then 7) and "3" at 7 (then 4)
    assert lookup_continuation(tokens, tokens, config, 2).tolist() == [7, 8]
    # equally long matches: the latest one
    tokens = np.array([5, 6, 1, 5, 6, 2, 5, 6])
    assert lookup_continuation(tokens, tokens, NgramConfig(min_match=2, max_match=2), 1).tolist() == [2]


def test_no_match_or_too_short_a_match_proposes_nothing():
    drafter = NgramDrafter(NgramConfig(min_match=3, max_match=4))
    assert drafter.propose(context([1, 2, 3, 4, 5]), 4) == Draft()  # the last token never occurred before
    assert drafter.propose(context([1, 2, 3, 9, 2, 3]), 4) == Draft()  # only a 2-gram repeats
    assert drafter.propose(context([]), 4) == Draft()
    assert drafter.propose(context([7]), 4) == Draft()


def test_a_repeating_run_drafts_its_continuation():
    drafter = NgramDrafter(NgramConfig(min_match=2, max_match=4))
    assert drafter.propose(context([4, 4, 4, 4]), 3).token_ids == (4,)  # the match ends just before the last
    assert drafter.propose(context([1, 2, 1, 2, 1, 2]), 3).token_ids == (1, 2)


@given(
    tokens=st.lists(st.integers(0, 4), min_size=0, max_size=40),
    min_match=st.integers(1, 3),
    extra=st.integers(0, 3),
    k=st.integers(0, 6),
)
def test_lookup_equals_brute_force(tokens, min_match, extra, k):
    config = NgramConfig(min_match=min_match, max_match=min_match + extra)
    array = np.asarray(tokens, dtype=np.int64)
    assert lookup_continuation(array, array, config, k).tolist() == brute_force(tokens, min_match, min_match + extra, k)


def test_prediction_is_drafted_while_the_output_follows_it():
    drafter = NgramDrafter(NgramConfig(max_drafts=4))
    prediction = [20, 21, 22, 23, 24, 25, 26]
    assert drafter.propose(context([1, 2], [], prediction), 3).token_ids == (20, 21, 22)
    assert drafter.propose(context([1, 2], [20, 21], prediction), 8).token_ids == (22, 23, 24, 25)
    assert drafter.propose(context([1, 2], prediction[:6], prediction), 8).token_ids == (26,)


def test_prediction_realigns_after_the_output_diverges():
    drafter = NgramDrafter(NgramConfig(min_match=2, max_match=4, max_drafts=3))
    prediction = [30, 31, 32, 33, 34, 35, 36, 37]
    # the model inserted 90 91 after "31", then went on with "32 33": the draft resumes after "32 33"
    assert drafter.propose(context([1], [30, 31, 90, 91, 32, 33], prediction), 3).token_ids == (34, 35, 36)
    # a replacement of one token: "30 31 99 33 34" realigns on "33 34"
    assert drafter.propose(context([1], [30, 31, 99, 33, 34], prediction), 2).token_ids == (35, 36)


def test_prediction_alignment_prefers_the_match_nearest_the_output_position():
    drafter = NgramDrafter(NgramConfig(min_match=2, max_match=2, max_drafts=2))
    # "5 6" appears twice in the prediction; the output (8 tokens) sits near the second one
    prediction = [5, 6, 1, 2, 3, 4, 7, 5, 6, 8, 9]
    output = [0, 1, 2, 3, 4, 7, 5, 6]  # diverged at its first token
    assert drafter.propose(context([], output, prediction), 2).token_ids == (8, 9)


def test_prediction_without_a_match_falls_back_to_prompt_lookup_and_can_be_turned_off():
    prompt = [1, 2, 3, 4, 1, 2]
    with_prediction = context(prompt, [], [50, 51])
    diverged = context(prompt, [9], [50, 51])  # the output left the prediction; nothing realigns
    assert NgramDrafter().propose(with_prediction, 2).token_ids == (50, 51)
    assert NgramDrafter().propose(context(prompt, [3], [50, 51]), 2).token_ids == (4, 1)  # diverged, no realignment
    assert NgramDrafter().propose(diverged, 2) == Draft()  # "9" occurs nowhere: no draft at all
    off = NgramDrafter(NgramConfig(use_prediction=False))
    assert off.propose(with_prediction, 2).token_ids == (3, 4)


def test_config_and_draft_validate():
    with pytest.raises(ValueError, match="min_match"):
        NgramConfig(min_match=3, max_match=2)
    with pytest.raises(ValueError, match="min_match"):
        NgramConfig(min_match=0)
    with pytest.raises(ValueError, match="max_drafts"):
        NgramConfig(max_drafts=-1)
    with pytest.raises(ValueError, match="one row per drafted token"):
        Draft((1, 2), np.zeros((3, 8), np.float32))
    assert len(Draft((1, 2), np.full((2, 8), 0.125, np.float32))) == 2
