"""Grammar masks and forced tokens in the on-device sampler (ember.compiler.kernels.sampling): the picked token
is always one the mask allows, logprobs never see the mask, unmasked rows stay bit-identical, and a forced
token reports what generation would have. Helpers and the float64 reference model come from test_sampling."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sampling import (
    PROPERTY,
    SAMPLE,
    SLOTS,
    WINDOW,
    K,
    V,
    draw_logits,
    np_allowed,
    np_log_softmax,
    np_processed,
    rows_with_history,
    sampled_params,
)

from ember.compiler.kernels.sampling import unpack_mask
from ember.runtime.sampling.params import RowState, SamplingParams, pack_batch


def pack_mask(allowed):
    """bool [R, V] -> llguidance's packed bitmask int32 [R, ceil(V/32)] (bit j of word w = token 32w + j)."""
    rows, vocab = allowed.shape
    padded = np.zeros((rows, -(-vocab // 32) * 32), bool)
    padded[:, :vocab] = allowed
    return np.packbits(padded, axis=-1, bitorder="little").view("<i4").astype(np.int32)


def run_masked(rows, logits, allowed=None, forced=None, **kw):
    batch = pack_batch(rows, vocab_size=V, **SLOTS)
    if allowed is not None:
        batch = batch._replace(allowed_mask=pack_mask(allowed))
    if forced is not None:
        batch = batch._replace(forced_token=np.asarray(forced, np.int32))
    result = SAMPLE(
        jnp.asarray(logits, jnp.float32),
        jax.tree.map(jnp.asarray, batch),
        num_top_logprobs=K,
        candidate_window=kw.get("window", WINDOW),
    )
    return jax.tree.map(np.asarray, result)


@st.composite
def masks(draw, rows=4, vocab=V):
    allowed = np.array(
        draw(st.lists(st.lists(st.booleans(), min_size=vocab, max_size=vocab), min_size=rows, max_size=rows))
    )
    sparse = draw(st.lists(st.integers(0, vocab - 1), min_size=rows, max_size=rows))
    for r, keep in enumerate(draw(st.lists(st.booleans(), min_size=rows, max_size=rows))):
        if keep:  # a grammar often allows a single token
            allowed[r] = False
        allowed[r, sparse[r]] = True  # every row allows at least one token
    return allowed


def test_unpack_mask_reads_llguidance_bit_order():
    allowed = np.random.default_rng(0).random((3, 70)) < 0.3
    allowed[1] = True
    np.testing.assert_array_equal(np.asarray(unpack_mask(jnp.asarray(pack_mask(allowed)), 70)), allowed)


@PROPERTY
@given(
    rows_with_history(st.one_of(st.just(SamplingParams(temperature=0.0)), sampled_params())),
    masks(),
    st.integers(0, 2**32 - 1),
    st.floats(0.2, 8.0),
)
def test_sampled_tokens_are_always_allowed_by_the_mask(rows, allowed, logit_seed, scale):
    logits = draw_logits(logit_seed, scale)
    masked, free = run_masked(rows, logits, allowed), run_masked(rows, logits)
    # the module's choice: logprobs are of the processed logits before the mask, so they do not move
    np.testing.assert_array_equal(masked.top_ids, free.top_ids)
    np.testing.assert_array_equal(masked.top_logprobs, free.top_logprobs)
    for r, row in enumerate(rows):
        token = masked.tokens[r]
        assert allowed[r, token], (r, row.params, token, np.flatnonzero(allowed[r]))
        processed = np_processed(logits[r], row)
        np.testing.assert_allclose(masked.logprob[r], np_log_softmax(processed)[token], rtol=1e-5, atol=1e-5)
        if row.params.is_greedy:  # greedy is the argmax over the allowed tokens
            assert processed[token] >= processed[allowed[r]].max() - 1e-4
        else:  # the filters see the masked distribution: the draw is in its allowed set
            kept = np_allowed(np.where(allowed[r], processed, -np.inf), row.params)
            assert kept[token], (r, row.params, token, np.flatnonzero(kept))


@PROPERTY
@given(
    st.lists(st.one_of(st.just(SamplingParams(temperature=0.0)), sampled_params()), min_size=4, max_size=4),
    masks(),
    st.integers(0, 2**32 - 1),
    st.floats(0.2, 8.0),
)
def test_an_all_ones_row_is_bit_identical_beside_masked_neighbours(params, allowed, logit_seed, scale):
    logits = draw_logits(logit_seed, scale)
    rows = [RowState(p, seed=7 + r, prompt_ids=[0], output_ids=[]) for r, p in enumerate(params)]
    allowed[0] = True  # row 0 is unconstrained, its neighbours are not
    masked, free = run_masked(rows, logits, allowed), run_masked(rows, logits)
    for field in ("tokens", "logprob", "top_ids", "top_logprobs"):
        np.testing.assert_array_equal(getattr(masked, field)[0], getattr(free, field)[0])


def test_the_grammar_wins_over_banned_tokens():
    # the only allowed token is banned by logit_bias (greedy row) / suppressed by min_tokens (sampled row)
    rows = [
        RowState(SamplingParams(temperature=0.0, logit_bias={9: -math.inf}), seed=1, prompt_ids=[0], output_ids=[]),
        RowState(
            SamplingParams(temperature=1.0, top_k=3, min_tokens=2),
            seed=2,
            prompt_ids=[0],
            output_ids=[],
            min_tokens_suppress_ids=(9,),
        ),
    ]
    allowed = np.zeros((2, V), bool)
    allowed[:, 9] = True
    result = run_masked(rows, draw_logits(3, 2.0, rows=2), allowed)
    assert result.tokens.tolist() == [9, 9] and np.all(np.isneginf(result.logprob))


@PROPERTY
@given(
    rows_with_history(st.one_of(st.just(SamplingParams(temperature=0.0)), sampled_params())),
    st.lists(st.integers(-1, V - 1), min_size=4, max_size=4),
    st.integers(0, 2**32 - 1),
    st.floats(0.2, 8.0),
)
def test_forced_tokens_report_the_logprobs_generation_would(rows, forced, logit_seed, scale):
    logits = draw_logits(logit_seed, scale)
    result, free = run_masked(rows, logits, forced=forced), run_masked(rows, logits)
    np.testing.assert_array_equal(result.top_ids, free.top_ids)
    np.testing.assert_array_equal(result.top_logprobs, free.top_logprobs)
    for r, row in enumerate(rows):
        if forced[r] < 0:  # not forced: the row's usual pick
            assert result.tokens[r] == free.tokens[r] and result.logprob[r] == free.logprob[r]
            continue
        assert result.tokens[r] == forced[r]
        np.testing.assert_allclose(
            result.logprob[r], np_log_softmax(np_processed(logits[r], row))[forced[r]], rtol=1e-5, atol=1e-5
        )
        if forced[r] == free.tokens[r]:  # the very token generation picked: bit-identical
            assert result.logprob[r] == free.logprob[r]


def test_pack_batch_masks_and_forced_tokens():
    rows = [
        RowState(SamplingParams(temperature=0.8, forced_token_ids=(5, 6, 7)), seed=1, prompt_ids=[1], output_ids=[5]),
        RowState(SamplingParams(temperature=0.8), seed=2, prompt_ids=[1], output_ids=[]),
    ]
    b = pack_batch(rows, vocab_size=70, history_bucket=1, num_rows=3)
    assert b.allowed_mask.shape == (3, 3) and np.all(b.allowed_mask == -1)  # ceil(70 / 32) words, all allowed
    assert b.forced_token.tolist() == [6, -1, -1]  # the second forced token: one was generated already
    assert b.temperature.tolist()[:2] == [0.0, np.float32(0.8)]  # a forced row draws nothing


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(forced_token_ids=()), "forced_token_ids"),
        (dict(forced_token_ids=(1, V)), "forced_token_ids"),
        (dict(forced_token_ids=(1, 2), max_tokens=1), "max_tokens"),
        (dict(forced_token_ids=(1, 2), n=2), "n"),
    ],
)
def test_forced_token_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kwargs).validate(V)
    SamplingParams(forced_token_ids=(1, 2), max_tokens=2).validate(V)
    assert SamplingParams.from_generation_config({}, forced_token_ids=[3, 4]).forced_token_ids == (3, 4)
