"""A model drafter's draws (`draft_sample`) verified with their own q: the emitted tokens are distributed as plain
sampling's (a chi-square test over a toy Markov target and drafter, the drafter's draws taken with the same
seeds and steps as the verifier's rows), a fixed seed reproduces them, q is the drafter's distribution under
the request's temperature / top-k, and the drafts' noise is independent of the verifier's (a drafter drawing
from the verifier's own noise fails the same test)."""

from __future__ import annotations

import jax
import numpy as np
from scipy.stats import chi2
from test_verify import ONE_SLOT, THRESHOLD_P, device, host, plain_batch, run, target_probs

from ember.compiler.kernels.sampling import sample
from ember.compiler.kernels.speculative.reference import draft_sample

DRAW = jax.jit(draft_sample)
PLAIN = jax.jit(sample, static_argnames=("num_top_logprobs", "candidate_window", "all_greedy"))
V, K, N = 6, 3, 24_000  # vocabulary, drafts per row, rows (independent trials)
TARGET = np.random.default_rng(21).normal(0, 1.2, (V, V))
DRAFT = np.random.default_rng(22).normal(0, 1.2, (V, V))


def _params(seeds, steps, temperature, top_k):
    return plain_batch(
        len(seeds), seed=seeds, step=steps, temperature=temperature, top_k=top_k, vocab=V, slots=ONE_SLOT
    )


def _draft(prev, seeds, steps, temperature, top_k, *, verifier_noise=False):
    """K drafts per row from the DRAFT chain: draft i at step steps + i, drawn by draft_sample (or, with
    verifier_noise, by the plain sampler: the verifier's own Gumbel noise at that step, q its distribution)."""
    drafts, q, last = np.zeros((N, K), np.int32), np.zeros((N, K, V), np.float32), prev
    for i in range(K):
        logits = DRAFT[last].astype(np.float32)
        params = device(_params(seeds, steps + i, temperature, top_k))
        drawn = host(DRAW(logits, params))
        q[:, i] = drawn.probs
        last = drawn.tokens if not verifier_noise else np.asarray(PLAIN(logits, params).tokens)
        drafts[:, i] = last
    return drafts, q


def speculate_two_tokens(temperature, top_k, seed0=0, *, verifier_noise=False):
    """The first two tokens of N rows (row r: seed seed0 * N + r) from token 0, by rounds of K drafts + verify."""
    seeds = (np.arange(N) + seed0 * N).astype(np.uint32)
    emitted = [[] for _ in range(N)]
    prev = np.zeros(N, np.int64)
    for _ in range(2):
        steps = np.array([len(e) for e in emitted], np.int32)
        drafts, q = _draft(prev, seeds, steps, temperature, top_k, verifier_noise=verifier_noise)
        context = np.concatenate([prev[:, None], drafts], axis=1)  # position i follows context[:, i]
        rows = _params(np.repeat(seeds, K + 1), (steps[:, None] + np.arange(K + 1)).reshape(-1), temperature, top_k)
        result = run(TARGET[context].astype(np.float32), rows, drafts, np.full(N, K, np.int32), q)
        for r in range(N):
            emitted[r].extend(result.tokens[r, : result.num_emitted[r]].tolist())
        prev = np.array([e[-1] for e in emitted])
    return np.array([e[:2] for e in emitted]), result


def chi_square(pairs, p):
    expected = (p[0][:, None] * p) * len(pairs)
    observed = np.zeros((V, V))
    np.add.at(observed, (pairs[:, 0], pairs[:, 1]), 1)
    cells = expected > 5
    assert observed[~cells].sum() <= max(expected[~cells].sum() * 3, 30)
    return ((observed[cells] - expected[cells]) ** 2 / expected[cells]).sum(), int(cells.sum()) - 1


def test_drafts_with_their_q_give_plain_samplings_distribution_and_a_seed_reproduces():
    for temperature, top_k in ((1.0, 0), (0.7, 3)):
        pairs, result = speculate_two_tokens(temperature, top_k)
        stat, dof = chi_square(pairs, target_probs(TARGET, temperature, top_k))
        assert stat < chi2.ppf(1 - THRESHOLD_P, dof), f"T={temperature} top-k={top_k}: chi-square {stat:.1f}"
        assert 0 < result.num_accepted.mean() < K  # some drafts accepted, some rejected: both paths ran
    again, _ = speculate_two_tokens(0.7, 3)
    other, _ = speculate_two_tokens(0.7, 3, seed0=1)
    np.testing.assert_array_equal(pairs, again)
    assert (pairs != other).any(axis=1).mean() > 0.3


def test_drafts_drawn_from_the_verifiers_own_noise_are_not_lossless():
    # the same test has the power to see a drafter whose noise is the residual draw's: it fails it
    pairs, _ = speculate_two_tokens(1.0, 0, verifier_noise=True)
    stat, dof = chi_square(pairs, target_probs(TARGET, 1.0, 0))
    assert stat > chi2.ppf(1 - THRESHOLD_P, dof), stat


def test_q_is_the_drafters_distribution_under_the_requests_settings():
    logits = DRAFT[np.arange(V) % V].astype(np.float32)
    seeds = np.arange(V).astype(np.uint32)
    for temperature, top_k in ((1.0, 0), (0.5, 2)):
        drawn = host(DRAW(logits, device(_params(seeds, np.zeros(V, np.int32), temperature, top_k))))
        np.testing.assert_allclose(drawn.probs, target_probs(DRAFT, temperature, top_k), rtol=1e-5, atol=1e-7)
        assert (drawn.probs[np.arange(V), drawn.tokens] > 0).all()
    greedy = host(DRAW(logits, device(_params(seeds, np.zeros(V, np.int32), 0.0, 0))))
    np.testing.assert_array_equal(greedy.tokens, DRAFT.argmax(-1))
    np.testing.assert_array_equal(greedy.probs, np.eye(V, dtype=np.float32)[DRAFT.argmax(-1)])
