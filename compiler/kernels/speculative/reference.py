"""Lossless verification of drafted tokens on device (reference `jnp`): greedy verify and rejection sampling.

A row (one sequence) arrives with up to K drafted tokens d_0..d_{n-1} (n = num_drafts[r] <= K) and the
target's logits at its K + 1 verify positions: position i holds the logits that follow d_0..d_{i-1}, so
position 0 is the ordinary next-token row and position n the bonus row. Every position carries its own
`SamplingBatch` row, laid out row-major (row r, position i is params row r * (K + 1) + i), packed by the
host as if d_0..d_{i-1} had already been emitted: history (penalties), step (= the row's step + i, so the
seed stream is the one plain decoding would use), min_tokens suppression, the grammar mask after d_0..d_{i-1}.

The target distribution p_i of a position is exactly what `ember.compiler.kernels.sampling.sample` draws
from with those settings (it reuses its processing: bias, suppression, penalties, grammar mask, temperature,
top-k / top-p / min-p); rows that do not draw (greedy, forced, a grammar stuck at -inf) have a point mass on
the sampler's pick.

Rejection sampling (Leviathan et al. 2023, Chen et al. 2023): walk i = 0..n-1, accept d_i with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection emit a token drawn from normalize(max(p_i - q_i, 0)) and
stop; if all n are accepted, emit a bonus token drawn from p_n. The emitted tokens are then distributed
exactly as n + 1 (or fewer) steps of plain sampling from p. q_i is the drafter's distribution the draft was
drawn from: a model drafter passes its rows `draft_probs`; a drafter without probabilities (n-gram, predicted
outputs) is a point mass on d_i, which turns the test into "accept with probability p_i(d_i)" and the residual
into p_i without d_i. For rows whose p is a point mass this is greedy verify: accept while d_i is the
target's pick, then emit the target's own pick (the correction, or the bonus).

Randomness, per row and position, from nothing but the row's seed and the position's step
(key_i = fold_in(key(seed), step_i), the plain sampler's key): the acceptance uniform comes from
fold_in(key_i, 1), the residual / bonus draw from key_i's Gumbel noise (the plain sampler's noise), so with no
drafts, or at the bonus position, the emitted token is bit-for-bit the one `sample` picks.

Logprobs, as the plain sampler reports them: log_softmax of each position's processed logits (before
temperature, filters and the grammar mask), for every emitted token.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ember.compiler.kernels.fixed_order import fixed_order_log_softmax
from ember.compiler.kernels.sampling import (
    GREEDY_EPSILON,
    SamplingBatch,
    _first_allowed,
    _row_gumbel,
    apply_mask,
    filter_logits,
    process_logits,
    sample,
)

_ACCEPT_STREAM = 1  # fold_in tag of the acceptance uniforms (the residual draw uses the step key itself)
_DRAFT_STREAM = 2  # fold_in tag of a model drafter's own draws (independent of the verifier's)


class VerifyResult(NamedTuple):
    tokens: jax.Array  # i32 [R, K+1]: the accepted drafts, then the target's token; -1 past num_emitted
    num_accepted: jax.Array  # i32 [R]: drafts accepted (0..num_drafts)
    num_emitted: jax.Array  # i32 [R]: num_accepted + 1
    logprob: jax.Array  # f32 [R, K+1]: log_softmax(processed logits)[token]; 0 past num_emitted
    top_ids: jax.Array  # i32 [R, K+1, T]: the T most likely ids of each position's processed distribution
    top_logprobs: jax.Array  # f32 [R, K+1, T]


def _leading_true(flags):
    """bool [R, K] -> i32 [R]: how many leading entries of each row are True."""
    return jnp.sum(jnp.cumprod(flags.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def _positions(x, rows, width):
    """[R * width, ...] -> [R, width, ...] (params rows are laid out row-major by position)."""
    return x.reshape(rows, width, *x.shape[1:])


def _emitted(drafts, num_accepted, final_token):
    """The emitted tokens i32 [R, K+1]: drafts before num_accepted, final_token at it, -1 after."""
    rows, k = drafts.shape
    index = jnp.arange(k + 1)[None, :]
    padded = jnp.concatenate([drafts, jnp.full((rows, 1), -1, drafts.dtype)], axis=-1)
    tokens = jnp.where(index < num_accepted[:, None], padded, -1)
    return jnp.where(index == num_accepted[:, None], final_token[:, None], tokens).astype(jnp.int32)


def _report(tokens, num_accepted, logprobs, num_top_logprobs):
    """Logprob of each emitted token and each position's top alternatives, from logprobs f32 [R, K+1, V]."""
    rows, width, vocab = logprobs.shape
    safe = jnp.maximum(tokens, 0)
    chosen = jnp.take_along_axis(logprobs, safe[..., None], -1)[..., 0]
    chosen = jnp.where(tokens >= 0, chosen, 0.0)
    k = min(int(num_top_logprobs), vocab)
    if k > 0:
        top_logprobs, top_ids = jax.lax.top_k(logprobs, k)
    else:
        top_logprobs = jnp.zeros((rows, width, 0), jnp.float32)
        top_ids = jnp.zeros((rows, width, 0), jnp.int32)
    return VerifyResult(tokens, num_accepted, num_accepted + 1, chosen, top_ids.astype(jnp.int32), top_logprobs)


def _log_softmax(x, fixed_order: bool):
    # fixed_order (deterministic steps): the sum in a fixed order, as the plain sampler's (sampling.sample)
    return fixed_order_log_softmax(x, axis=-1) if fixed_order else jax.nn.log_softmax(x, axis=-1)


def greedy_verify(
    logits, params: SamplingBatch, drafts, num_drafts, num_top_logprobs: int = 0, fixed_order: bool = False
) -> VerifyResult:
    """Every row greedy (or forced): accept the longest prefix where d_i is the target's pick, then the pick.

    logits f32 [R, K+1, V]; params R * (K+1) rows; drafts i32 [R, K] (-1 past num_drafts); num_drafts i32 [R].
    The emitted tokens are exactly the picks of plain greedy decoding over the same logits.
    """
    rows, width, vocab = logits.shape
    flat = logits.reshape(rows * width, vocab)
    picked = sample(flat, params, 0, all_greedy=True).tokens.reshape(rows, width)  # [R, K+1]
    in_range = jnp.arange(width - 1)[None, :] < num_drafts[:, None]
    num_accepted = _leading_true(in_range & (drafts == picked[:, :-1]))
    final = jnp.take_along_axis(picked, num_accepted[:, None], -1)[:, 0]
    tokens = _emitted(drafts, num_accepted, final)
    logprobs = _log_softmax(process_logits(flat, params), fixed_order).reshape(rows, width, vocab)
    return _report(tokens, num_accepted, logprobs, num_top_logprobs)


def target_distribution(logits, params: SamplingBatch, fixed_order: bool = False):
    """What the plain sampler draws from, per row: (scores f32 [N, V], point_mass bool [N], pick i32 [N]).

    scores are the temperature-scaled, filtered, grammar-masked logits (-inf = never drawn), so
    p = softmax(scores); for rows that do not draw (greedy, forced, stuck grammar) scores are 0 at the pick and
    -inf elsewhere. pick is the sampler's deterministic choice (meaningful where point_mass).
    """
    processed = process_logits(logits, params)
    vocab = processed.shape[-1]
    constrained = apply_mask(processed, params.allowed_mask)
    greedy = params.temperature < GREEDY_EPSILON
    pick = jnp.argmax(constrained, axis=-1).astype(jnp.int32)
    stuck = jnp.take_along_axis(constrained, pick[:, None], -1)[:, 0] == -jnp.inf
    pick = jnp.where(stuck, _first_allowed(params.allowed_mask), pick)
    forced = params.forced_token >= 0
    pick = jnp.where(forced, params.forced_token, pick)
    point_mass = greedy | stuck | forced
    # the sampler's own scaling and filters (greedy rows switched off, as it does)
    temperature = jnp.where(greedy, 1.0, params.temperature)[:, None]
    filters = params._replace(top_k=jnp.where(greedy, 0, params.top_k), top_p=jnp.where(greedy, 1.0, params.top_p))
    scaled = filter_logits(constrained / temperature, filters, fixed_order=fixed_order)
    one_hot = jnp.where(jnp.arange(vocab)[None, :] == pick[:, None], 0.0, -jnp.inf)
    return jnp.where(point_mass[:, None], one_hot, scaled), point_mass, pick


def _row_keys(seed, step):
    return jax.vmap(lambda s, t: jax.random.fold_in(jax.random.key(s), t))(seed, step)


class DraftSample(NamedTuple):
    tokens: jax.Array  # i32 [N]: the drafted token of each row
    probs: jax.Array  # f32 [N, V]: q, the distribution it was drawn from (one-hot for point-mass rows)


def draft_sample(logits, params: SamplingBatch) -> DraftSample:
    """A model drafter's draw: token ~ q = softmax(target_distribution(draft logits, params)), i.e. the draft
    model's logits through the request's own pipeline (temperature, top-k / top-p / min-p, bias, penalties).

    logits f32 [N, V]; params N rows, row i packed for the draft's step (the row's step + i). Any q keeps
    verification lossless as long as verify is handed the q the token was drawn from; sharing the pipeline
    makes q close to p. The noise is the step key's `_DRAFT_STREAM` fold, independent of the verifier's
    acceptance uniform and residual draw at the same (seed, step), so a fixed seed reproduces the drafts.
    """
    scores, point_mass, pick = target_distribution(logits, params)
    vocab = scores.shape[-1]
    keys = _row_keys(params.seed, params.step)
    noise = jax.vmap(lambda key: jax.random.gumbel(jax.random.fold_in(key, _DRAFT_STREAM), (vocab,)))(keys)
    drawn = jnp.argmax(scores + noise, axis=-1).astype(jnp.int32)
    return DraftSample(jnp.where(point_mass, pick, drawn), jax.nn.softmax(scores, axis=-1))


def speculative_sample(
    logits,
    params: SamplingBatch,
    drafts,
    num_drafts,
    draft_probs=None,
    has_draft_probs=None,
    num_top_logprobs: int = 0,
    fixed_order: bool = False,
) -> VerifyResult:
    """Rejection-sampling verify of R rows (greedy rows take the greedy-verify outcome exactly).

    logits f32 [R, K+1, V]; params R * (K+1) rows; drafts i32 [R, K] (-1 past num_drafts); num_drafts i32 [R];
    draft_probs f32 [R, K, V] or None (static: then every row's q is a point mass); has_draft_probs bool [R]
    (which rows' q is draft_probs; the rest are point masses; default all when draft_probs is given).
    """
    rows, width, vocab = logits.shape
    k = width - 1
    flat = logits.reshape(rows * width, vocab)
    scores, point_mass, pick = target_distribution(flat, params, fixed_order)
    log_p = _log_softmax(scores, fixed_order).reshape(rows, width, vocab)  # -inf outside p's support
    scores = scores.reshape(rows, width, vocab)
    safe_drafts = jnp.maximum(drafts, 0)
    p_draft = jnp.exp(jnp.take_along_axis(log_p[:, :k], safe_drafts[..., None], -1)[..., 0])  # [R, K]
    if draft_probs is None:
        q_draft = jnp.ones_like(p_draft)
        with_q = jnp.zeros((rows,), bool)
    else:
        with_q = jnp.ones((rows,), bool) if has_draft_probs is None else has_draft_probs
        q_model = jnp.take_along_axis(draft_probs.astype(jnp.float32), safe_drafts[..., None], -1)[..., 0]
        q_draft = jnp.where(with_q[:, None], q_model, 1.0)

    keys = _row_keys(params.seed, params.step)  # [R * (K+1)]
    uniforms = jax.vmap(lambda key: jax.random.uniform(jax.random.fold_in(key, _ACCEPT_STREAM)))(keys)
    uniforms = _positions(uniforms, rows, width)[:, :k]  # [R, K]
    # accept with probability min(1, p/q): u < p/q, written without the division (q may be 0 where p > 0)
    in_range = jnp.arange(k)[None, :] < num_drafts[:, None]
    num_accepted = _leading_true(in_range & (uniforms * q_draft < p_draft))

    # the one draw each row makes, at position a = num_accepted: the residual after a rejection, p_a if a == n
    at = num_accepted[:, None]
    scores_a = jnp.take_along_axis(scores, at[..., None], 1)[:, 0]  # [R, V]
    rejected = num_accepted < num_drafts
    # the rejected draft (a padding column makes a == K safe; it is only read where a < n)
    d_a = jnp.take_along_axis(jnp.pad(safe_drafts, ((0, 0), (0, 1))), at, -1)[:, 0]
    point_residual = jnp.where(jnp.arange(vocab)[None, :] == d_a[:, None], -jnp.inf, scores_a)  # p without d_a
    if draft_probs is None:
        residual = point_residual
    else:
        q_padded = jnp.pad(draft_probs.astype(jnp.float32), ((0, 0), (0, 1), (0, 0)))
        q_a = jnp.take_along_axis(q_padded, at[..., None], 1)[:, 0]  # [R, V]
        p_a = jnp.exp(jnp.take_along_axis(log_p, at[..., None], 1)[:, 0])
        mass = jnp.maximum(p_a - q_a, 0.0)
        model_residual = jnp.where(mass > 0, jnp.log(jnp.where(mass > 0, mass, 1.0)), -jnp.inf)
        residual = jnp.where(with_q[:, None], model_residual, point_residual)
    # rounding can leave no residual mass (p and q equal to the last bit): fall back to p
    residual = jnp.where(jnp.any(residual > -jnp.inf, axis=-1, keepdims=True), residual, scores_a)
    draw_scores = jnp.where(rejected[:, None], residual, scores_a)
    seed_a = jnp.take_along_axis(_positions(params.seed, rows, width), at, 1)[:, 0]
    step_a = jnp.take_along_axis(_positions(params.step, rows, width), at, 1)[:, 0]
    noise = jax.vmap(_row_gumbel, in_axes=(0, 0, None))(seed_a, step_a, vocab)  # the plain sampler's noise
    drawn = jnp.argmax(draw_scores + noise, axis=-1).astype(jnp.int32)
    pick_a = jnp.take_along_axis(_positions(pick, rows, width), at, 1)[:, 0]
    mass_a = jnp.take_along_axis(_positions(point_mass, rows, width), at, 1)[:, 0]
    final = jnp.where(mass_a, pick_a, drawn)

    tokens = _emitted(drafts, num_accepted, final)
    logprobs = _log_softmax(process_logits(flat, params), fixed_order).reshape(rows, width, vocab)
    return _report(tokens, num_accepted, logprobs, num_top_logprobs)


def verify(
    logits,
    params: SamplingBatch,
    drafts,
    num_drafts,
    draft_probs=None,
    has_draft_probs=None,
    num_top_logprobs: int = 0,
    *,
    all_greedy: bool = False,
    fixed_order: bool = False,
) -> VerifyResult:
    """The step's verify: `greedy_verify` when every row is greedy (static promise, no V-wide noise and no
    probabilities), else `speculative_sample`. Jit with static_argnames=("num_top_logprobs", "all_greedy",
    "fixed_order"); fixed_order (deterministic steps) sums as the plain sampler's fixed_order does."""
    if all_greedy:
        return greedy_verify(logits, params, drafts, num_drafts, num_top_logprobs, fixed_order)
    return speculative_sample(
        logits, params, drafts, num_drafts, draft_probs, has_draft_probs, num_top_logprobs, fixed_order
    )
