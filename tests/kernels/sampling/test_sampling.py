"""The batched on-device sampler (ember.compiler.kernels.sampling) and its host-side packing
(ember.runtime.sampling.params), checked against an independent float64 numpy model of the semantics."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.compiler.kernels.sampling import sample
from ember.runtime.sampling.params import (
    MAX_N,
    RowState,
    SamplingParams,
    choice_seed,
    history_length_needed,
    pack_batch,
    resolve_seed,
)

SAMPLE = jax.jit(
    sample, static_argnames=("num_top_logprobs", "candidate_window", "all_greedy")
)  # one compile per shape
V = 64  # vocabulary of the property tests
SLOTS = dict(history_bucket=16, bias_slots=4, suppress_slots=4)
K = 5
WINDOW = 16  # top-k/top-p candidate window of the V = 64 tests: both the window and the full-sort path run
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(rows, logits, *, vocab=V, k=K, num_rows=None, window=WINDOW, **slots):
    batch = pack_batch(rows, vocab_size=vocab, num_rows=num_rows, **{**SLOTS, **slots})
    result = SAMPLE(
        jnp.asarray(logits, jnp.float32), jax.tree.map(jnp.asarray, batch), num_top_logprobs=k, candidate_window=window
    )
    return jax.tree.map(np.asarray, result)


# --- the reference model, in float64 numpy -----------------------------------------------------------
def np_processed(logits, row: RowState):
    x = np.asarray(logits, np.float64).copy()
    p = row.params
    for token, value in (p.logit_bias or {}).items():
        x[token] += value
    if row.min_tokens_in_force:
        x[list(row.min_tokens_suppress_ids)] = -np.inf
    if p.has_penalties:
        for token in set(row.prompt_ids) | set(row.output_ids):
            x[token] = x[token] / p.repetition_penalty if x[token] > 0 else x[token] * p.repetition_penalty
        for token, count in Counter(row.output_ids).items():
            x[token] -= p.frequency_penalty * count + p.presence_penalty
    return x


def np_log_softmax(x):
    top = np.max(x)
    return x - top - np.log(np.sum(np.exp(x - top)))


def np_allowed(processed, params: SamplingParams, tol=1e-4):
    """Tokens top-k, then top-p, then min-p may keep (a superset by `tol`, for float32 rounding)."""
    s = processed / params.temperature
    tol = tol * max(1.0, float(np.max(np.abs(s[np.isfinite(s)]))))
    allowed = np.isfinite(s)
    if 0 < params.top_k < len(s):
        allowed &= s >= np.sort(s)[::-1][params.top_k - 1] - tol
    if params.top_p < 1:
        probs = np.exp(np_log_softmax(np.where(allowed, s, -np.inf)))
        above = np.array([probs[(s > v + tol) & allowed].sum() for v in s])  # mass of strictly better tokens
        allowed &= above < params.top_p + 1e-5
    if params.min_p > 0:
        allowed &= s >= np.max(s) + math.log(params.min_p) - tol
    return allowed


def draw_logits(seed, scale, vocab=V, rows=4):
    return (np.random.default_rng(seed).normal(size=(rows, vocab)) * scale).astype(np.float32)


@st.composite
def sampled_params(draw, **fixed):
    values = dict(
        temperature=draw(st.floats(0.05, 2.0)),
        top_k=draw(st.one_of(st.just(0), st.integers(1, V + 4))),
        top_p=draw(st.one_of(st.just(1.0), st.floats(0.05, 1.0))),
        min_p=draw(st.one_of(st.just(0.0), st.floats(0.0, 0.6))),
    )
    return SamplingParams(**{**values, **fixed})


@st.composite
def rows_with_history(draw, params_strategy, vocab=V, count=4):
    rows = []
    for _ in range(count):
        penalties = draw(
            st.one_of(
                st.just({}),
                st.fixed_dictionaries(
                    dict(
                        repetition_penalty=st.floats(0.5, 2.0),
                        presence_penalty=st.floats(-2, 2),
                        frequency_penalty=st.floats(-2, 2),
                    )
                ),
            )
        )
        bias = draw(st.dictionaries(st.integers(0, vocab - 1), st.floats(-5, 5), max_size=4))
        params = replace(draw(params_strategy), **penalties, logit_bias=bias or None)
        prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8))
        output = draw(st.lists(st.integers(0, vocab - 1), max_size=8))
        rows.append(RowState(params, seed=draw(st.integers(0, 2**32 - 1)), prompt_ids=prompt, output_ids=output))
    return rows


# --- filters ------------------------------------------------------------------------------------------
@PROPERTY
@given(
    st.lists(sampled_params(), min_size=4, max_size=4),
    st.integers(0, 2**32 - 1),
    st.floats(0.2, 8.0),
    st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=4),
)
def test_filters_never_sample_outside_the_allowed_set(params, logit_seed, scale, seeds):
    logits = draw_logits(logit_seed, scale)
    rows = [RowState(p, seed=s, prompt_ids=[0], output_ids=[]) for p, s in zip(params, seeds)]
    tokens = run(rows, logits).tokens
    np.testing.assert_array_equal(run(rows, logits, window=V).tokens, tokens)  # the window only trades speed
    for r, row in enumerate(rows):
        allowed = np_allowed(np_processed(logits[r], row), row.params)
        assert allowed[tokens[r]], (r, row.params, tokens[r], np.flatnonzero(allowed))


LADDER = [2.0, 1.6, 1.2, 0.9, 0.5, 0.0, -1.0, -3.0]
SLOPE = [-0.05 * i for i in range(V)]  # a flat-ish 64-token distribution: nuclei longer than the window
TIED = [1.0] + [0.0] * 40 + [-1.0] * 23  # the k-th value is tied far past the window


@pytest.mark.parametrize(
    "logits, params, kept",
    [
        (LADDER, SamplingParams(temperature=1.5), 8),
        (LADDER, SamplingParams(temperature=1.5, top_k=5), 5),
        (LADDER, SamplingParams(temperature=1.5, top_p=0.8), 5),  # mass before the 5th token: 0.78
        (LADDER, SamplingParams(temperature=1.5, min_p=0.3), 5),  # the 5th token has 0.37 of the top probability
        (LADDER, SamplingParams(temperature=0.7, top_k=6, top_p=0.9, min_p=0.05), 4),  # each filter cuts
        ([2.0, 1.0, 1.0, 1.0, 0.0, 0.0, -1.0, -1.0], SamplingParams(temperature=1.0, top_k=2), 4),  # ties stay in
        # V = 64 with a 16-token candidate window: decided inside the window, or by the full-sort fallback
        (SLOPE, SamplingParams(temperature=1.0, top_k=10), 10),
        (SLOPE, SamplingParams(temperature=1.0, top_k=40), 40),
        (SLOPE, SamplingParams(temperature=1.0, top_p=0.3), 7),
        (SLOPE, SamplingParams(temperature=1.0, top_p=0.85), 34),
        (TIED, SamplingParams(temperature=1.0, top_k=5, top_p=0.1), 41),  # the top token alone has 0.064 < 0.1
    ],
)
def test_draws_cover_exactly_the_filtered_distribution(logits, params, kept):
    # 4096 rows share one row's logits and settings, each with its own seed: a histogram of one draw each
    logits = np.array(logits, np.float32)
    vocab = len(logits)
    rows = [RowState(params, seed=s, prompt_ids=[0], output_ids=[]) for s in range(4096)]
    result = run(rows, np.tile(logits, (len(rows), 1)), vocab=vocab, k=0, history_bucket=1)
    allowed = np_allowed(logits.astype(np.float64), params, tol=0.0)
    assert allowed.sum() == kept
    s = logits.astype(np.float64) / params.temperature
    expected = np.exp(np_log_softmax(np.where(allowed, s, -np.inf)))
    assert result.top_ids.shape == (len(rows), 0) and result.top_logprobs.shape == (len(rows), 0)  # K = 0
    observed = np.bincount(result.tokens, minlength=vocab) / len(rows)
    assert np.array_equal(observed > 0, allowed)  # nothing outside, and every allowed token shows up
    np.testing.assert_allclose(observed, expected, atol=0.025)
    # logprobs describe the processed distribution, not the truncated one the draw came from
    np.testing.assert_allclose(result.logprob, np_log_softmax(logits.astype(np.float64))[result.tokens], atol=1e-5)


# --- randomness -----------------------------------------------------------------------------------------
@PROPERTY
@given(rows_with_history(sampled_params()), st.integers(0, 2**32 - 1), st.floats(0.2, 8.0), st.permutations(range(4)))
def test_a_row_is_independent_of_its_batch(rows, logit_seed, scale, order):
    logits = draw_logits(logit_seed, scale)
    together = run(rows, logits)
    again = run(rows, logits)
    np.testing.assert_array_equal(together.tokens, again.tokens)  # same seed + same step: same token
    shuffled = run([rows[i] for i in order], logits[order])
    np.testing.assert_array_equal(shuffled.tokens, together.tokens[order])
    np.testing.assert_array_equal(shuffled.logprob, together.logprob[order])
    padded = run(rows[:2], logits, num_rows=4)  # same rows beside inert padding rows
    np.testing.assert_array_equal(padded.tokens[:2], together.tokens[:2])
    for r in range(4):
        alone = run([rows[r]], logits[r : r + 1])
        assert alone.tokens[0] == together.tokens[r]
        assert alone.logprob[0] == together.logprob[r]
        np.testing.assert_array_equal(alone.top_ids[0], together.top_ids[r])


def test_filters_off_rows_are_untouched_by_a_neighbour_that_sorts():
    logits = draw_logits(7, 3.0)
    plain = RowState(SamplingParams(temperature=1.0), seed=5, prompt_ids=[1], output_ids=[])
    sorting = RowState(SamplingParams(temperature=1.0, top_k=3, top_p=0.5), seed=6, prompt_ids=[1], output_ids=[])
    for step in range(20):  # many draws from the plain row: with and without the sorting path taken
        row = RowState(plain.params, seed=5, prompt_ids=[1], output_ids=[], step=step)
        alone = run([row], logits[:1]).tokens[0]
        assert run([row, sorting, row, row], logits).tokens[0] == alone


def test_steps_give_fresh_draws_and_seeds_reproduce():
    logits = np.zeros((1, V), np.float32)  # flat: every token equally likely
    params = SamplingParams(temperature=1.0)
    draws = [
        run([RowState(params, seed=11, prompt_ids=[0], output_ids=[], step=t)], logits).tokens[0] for t in range(8)
    ]
    assert len(set(draws)) > 1
    assert draws == [
        run([RowState(params, seed=11, prompt_ids=[0], output_ids=[], step=t)], logits).tokens[0] for t in range(8)
    ]
    other_seed = [
        run([RowState(params, seed=12, prompt_ids=[0], output_ids=[], step=t)], logits).tokens[0] for t in range(8)
    ]
    assert other_seed != draws


# --- greedy, logprobs, bias, suppression ------------------------------------------------------------------
@PROPERTY
@given(
    rows_with_history(st.one_of(st.just(SamplingParams(temperature=0.0)), sampled_params())),
    st.integers(0, 2**32 - 1),
    st.floats(0.2, 8.0),
)
def test_greedy_is_argmax_and_logprobs_are_of_the_processed_logits(rows, logit_seed, scale):
    logits = draw_logits(logit_seed, scale)
    result = run(rows, logits)
    for r, row in enumerate(rows):
        processed = np_processed(logits[r], row)
        reference = np_log_softmax(processed)
        token = result.tokens[r]
        if row.params.is_greedy:
            assert processed[token] >= processed.max() - 1e-4
        np.testing.assert_allclose(result.logprob[r], reference[token], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(result.top_logprobs[r], np.sort(reference)[::-1][:K], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(reference[result.top_ids[r]], result.top_logprobs[r], rtol=1e-5, atol=1e-5)
        assert len(set(result.top_ids[r])) == K and np.all(np.diff(result.top_logprobs[r]) <= 0)


@PROPERTY
@given(
    st.lists(st.one_of(st.just(SamplingParams(temperature=0.0)), sampled_params()), min_size=4, max_size=4),
    st.integers(0, 2**32 - 1),
    st.floats(0.2, 8.0),
    st.integers(0, 2**32 - 1),
)
def test_logit_bias_forces_and_bans_tokens(params, logit_seed, scale, seed):
    logits = draw_logits(logit_seed, scale)
    best = np.argsort(-logits, axis=-1)  # ban the likeliest tokens: the hardest case
    rows = []
    for r, p in enumerate(params):
        bias = {int(best[r, 0]): -100.0, int(best[r, 1]): -math.inf, int(best[r, 2]): -100.0}
        if r % 2 == 0:
            bias[int(best[r, -1])] = 100.0  # the least likely token becomes the only sensible one
        rows.append(RowState(replace(p, logit_bias=bias), seed=seed + r, prompt_ids=[0], output_ids=[]))
    tokens = run(rows, logits).tokens
    for r in range(4):
        assert tokens[r] not in best[r, :3]
        if r % 2 == 0:
            assert tokens[r] == best[r, -1]


@PROPERTY
@given(
    st.one_of(st.just(SamplingParams(temperature=0.0, min_tokens=4)), sampled_params(min_tokens=4)),
    st.integers(0, 2**32 - 1),
    st.integers(1, 4),
    st.integers(0, 2**32 - 1),
)
def test_min_tokens_suppresses_stop_ids_until_reached(params, logit_seed, how_many, seed):
    logits = draw_logits(logit_seed, 6.0)
    best = np.argsort(-logits, axis=-1)
    rows = [
        RowState(
            params,
            seed=seed,
            prompt_ids=[0],
            output_ids=[1] * r,
            min_tokens_suppress_ids=tuple(int(t) for t in best[r, :how_many]),
        )
        for r in range(4)
    ]
    tokens = run(rows, logits).tokens
    for r in range(4):
        assert tokens[r] not in best[r, :how_many]  # fewer than 4 generated: suppressed
    done = RowState(
        SamplingParams(temperature=0.0, min_tokens=4),
        seed=0,
        prompt_ids=[0],
        output_ids=[1] * 4,
        min_tokens_suppress_ids=(int(best[0, 0]),),
    )
    assert run([done], logits[:1]).tokens[0] == best[0, 0]  # reached: the eos/stop id is allowed again


# --- penalties move the distribution the right way (V = K = 20: top_logprobs is the whole distribution) ---
def full_logprobs(rows, logits):
    result = run(rows, logits, vocab=20, k=20)
    full = np.empty((len(rows), 20))
    np.put_along_axis(full, result.top_ids, result.top_logprobs, axis=-1)
    return full


@PROPERTY
@given(
    st.floats(0.05, 2.0),
    st.floats(0.0, 2.0),
    st.floats(1.05, 3.0),
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 11), max_size=10),
    st.lists(st.integers(0, 11), min_size=1, max_size=6),
)
def test_penalties_lower_the_probability_of_seen_tokens(freq, presence, repetition, logit_seed, output, prompt):
    logits = np.tile(draw_logits(logit_seed, 3.0, vocab=20, rows=1), (3, 1))
    plain = RowState(SamplingParams(temperature=0.0), seed=0, prompt_ids=prompt, output_ids=output)
    counted = RowState(
        SamplingParams(temperature=0.0, frequency_penalty=freq, presence_penalty=presence),
        seed=0,
        prompt_ids=prompt,
        output_ids=output,
    )
    repeated = RowState(
        SamplingParams(temperature=0.0, repetition_penalty=repetition), seed=0, prompt_ids=prompt, output_ids=output
    )
    base, counted_lp, repeated_lp = full_logprobs([plain, counted, repeated], logits)
    counts = Counter(output)
    # ids 12..19 are never seen: their shift is the softmax normaliser, common to every token
    shift = (counted_lp - base)[19]
    for token in range(20):
        drop = freq * counts[token] + (presence if counts[token] else 0.0)
        np.testing.assert_allclose(counted_lp[token] - base[token] - shift, -drop, atol=1e-4)
        if counts[token]:  # generated tokens lose probability against every unseen token...
            assert counted_lp[token] - base[token] < shift - 0.9 * drop
    if len(counts) == 1:  # ...and in absolute terms when they are the only ones penalised
        token = next(iter(counts))
        assert counted_lp[token] < base[token]
    seen = set(prompt) | set(output)
    shift = (repeated_lp - base)[19]
    for token in range(20):
        moved = repeated_lp[token] - base[token] - shift  # ...and the repetition penalty hits prompt tokens too
        if token in seen and abs(logits[0, token]) > 1e-2:
            assert moved < 0
            x = float(logits[0, token])
            np.testing.assert_allclose(moved, (x / repetition if x > 0 else x * repetition) - x, atol=1e-4)
        elif token not in seen:
            assert abs(moved) < 1e-5


# --- host side: settings, validation, packing -------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=0.0), "top_p"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3.0), "frequency_penalty"),
        (dict(logit_bias={V: 1.0}), "logit_bias"),
        (dict(logit_bias={1: 150.0}), "logit_bias"),
        (dict(logit_bias={1: math.nan}), "logit_bias"),
        (dict(logit_bias={i: 1.0 for i in range(65)}), "logit_bias"),
        (dict(seed="7"), "seed"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=5, max_tokens=4), "min_tokens"),
        (dict(stop=("",)), "stop"),
        (dict(stop_token_ids=(V,)), "stop_token_ids"),
        (dict(logprobs=21), "logprobs"),
        (dict(logprobs=-1), "logprobs"),
        (dict(n=0), "n"),
        (dict(n=MAX_N + 1), "n"),
    ],
)
def test_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        SamplingParams(**kwargs).validate(V)


def test_valid_settings_pass():
    SamplingParams().validate(V)
    SamplingParams(
        temperature=0,
        top_k=-1,
        top_p=1,
        min_p=1,
        logit_bias={0: -math.inf, 1: 100},
        seed=-3,
        max_tokens=5,
        min_tokens=5,
        stop=("x",),
        stop_token_ids=(V - 1,),
        logprobs=20,
        n=MAX_N,
    ).validate(V)


def test_generation_config_defaults_and_overrides():
    qwen = {
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
        "max_new_tokens": 2048,
        "bos_token_id": 1,
    }
    p = SamplingParams.from_generation_config(qwen)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.max_tokens) == (0.7, 0.8, 20, 1.05, 2048)
    assert p.min_p == 0.0  # only keys the config sets count
    p = SamplingParams.from_generation_config(qwen, temperature=0.0, top_p=None, stop="END", seed=3)
    assert (p.temperature, p.top_p, p.stop, p.seed) == (0.0, 0.8, ("END",), 3)
    assert SamplingParams.from_generation_config({"do_sample": False, "temperature": 0.9}).temperature == 0.0
    assert SamplingParams.from_generation_config(None) == SamplingParams()
    with pytest.raises(TypeError, match="tempreture"):
        SamplingParams.from_generation_config({}, tempreture=1.0)


def test_pack_batch_layout():
    rows = [
        RowState(
            SamplingParams(temperature=0.5, top_k=V + 10, repetition_penalty=1.2, logit_bias={3: 2.0}, min_tokens=2),
            seed=2**32 + 5,
            prompt_ids=[7, 8],
            output_ids=[9],
            min_tokens_suppress_ids=(1, 2, 1),
        ),
        RowState(SamplingParams(top_k=-1), seed=4, prompt_ids=[1, 2, 3], output_ids=[4, 5]),
    ]
    assert history_length_needed(rows) == 3  # the second row has no penalty: its history is not packed
    b = pack_batch(rows, vocab_size=V, history_bucket=3, bias_slots=2, suppress_slots=2, num_rows=3)
    assert b.history_ids.shape == (3, 3) and b.bias_ids.shape == (3, 2) and b.suppress_ids.shape == (3, 2)
    assert b.seed.dtype == np.uint32 and list(b.seed) == [5, 4, 0] and list(b.step) == [1, 2, 0]
    assert list(b.top_k) == [0, 0, 0] and list(b.temperature) == [0.5, 1.0, 0.0]  # pad row: greedy
    assert b.history_ids.tolist() == [[7, 8, 9], [-1] * 3, [-1] * 3]
    assert b.history_is_output.tolist() == [[False, False, True], [False] * 3, [False] * 3]
    assert b.bias_ids.tolist() == [[3, -1], [-1, -1], [-1, -1]] and b.bias_values[0, 0] == 2.0
    assert b.suppress_ids.tolist() == [[1, 2], [-1, -1], [-1, -1]]
    with pytest.raises(ValueError, match="history bucket"):
        pack_batch(rows, vocab_size=V, history_bucket=2)
    with pytest.raises(ValueError, match="bias slots"):
        pack_batch(rows, vocab_size=V, history_bucket=3, bias_slots=0)
    with pytest.raises(ValueError, match="suppression slots"):
        pack_batch(rows, vocab_size=V, history_bucket=3, suppress_slots=1)


def test_seeds_and_suppressed_ids():
    assert resolve_seed(SamplingParams(seed=-1)) == 2**32 - 1
    assert 0 <= resolve_seed(SamplingParams()) < 2**32
    assert len({choice_seed(2**32 - 2, i) for i in range(MAX_N)}) == MAX_N
    p = SamplingParams(stop_token_ids=(5, 6))
    assert p.suppressed_while_min_tokens([6, 7]) == (5, 6, 7)
    assert SamplingParams(ignore_eos=True, stop_token_ids=(5,)).suppressed_while_min_tokens([7]) == (5,)


@PROPERTY
@given(rows_with_history(st.just(SamplingParams(temperature=0.0))), st.integers(0, 2**32 - 1), st.floats(0.2, 8.0))
def test_the_static_all_greedy_path_gives_the_general_paths_result(rows, logit_seed, scale):
    """all_greedy=True (no conditionals in the step) is an optimisation only: same tokens, same logprobs."""
    logits = draw_logits(logit_seed, scale)
    general = run(rows, logits)
    batch = pack_batch(rows, vocab_size=V, **SLOTS)
    static = jax.tree.map(
        np.asarray,
        SAMPLE(
            jnp.asarray(logits),
            jax.tree.map(jnp.asarray, batch),
            num_top_logprobs=K,
            candidate_window=WINDOW,
            all_greedy=True,
        ),
    )
    for got, want in zip(static, general, strict=True):
        assert got.tobytes() == want.tobytes()
