"""Batched next-token sampling on device (reference `jnp`): one call picks a token for each of R rows.

It runs inside the jitted step, so every shape is static: R rows, a V-wide vocabulary, MB logit-bias
slots, H history slots, S suppression slots and K top logprobs. Each row carries its own settings
(`SamplingBatch`, packed on the host by `ember.runtime.sampling.params.pack_batch`).

Order of processing (vLLM's documented semantics; the filter order top-k → top-p → min-p is HF's and
vLLM v0's):

1. logit_bias is added; min_tokens suppression forces the row's stop/eos ids to -inf;
2. penalties, HF/vLLM style: repetition_penalty divides positive and multiplies negative logits of
   every token seen in prompt + output; then frequency_penalty * count and presence_penalty * (count > 0)
   are subtracted, counting only *generated* tokens (OpenAI semantics).
   The result is the row's **processed logits**;
3. greedy rows (temperature < 1e-5, vLLM's epsilon; 0 is the documented spelling) take argmax of the
   processed logits and ignore every filter;
4. sampled rows divide by temperature, then keep top_k (ties with the k-th value are kept), then top_p
   (the smallest set of most likely tokens whose mass reaches top_p, computed on the top-k
   renormalised distribution; the top token is always kept), then min_p (drop tokens whose probability
   is below min_p * the top probability), and draw with the Gumbel-max trick.

Grammar masks (constrained decoding) and forced tokens act on what is *picked*, never on what is reported:

- `allowed_mask` (llguidance's packed bitmask: bit j of word w allows token 32*w + j) sends every
  disallowed token to -inf *after* step 2: greedy takes argmax over the allowed tokens, and sampled rows
  apply temperature, top-k, top-p and min-p to the masked distribution (so a filter can never leave a row
  with nothing allowed). If a row's allowed tokens are all at -inf already (banned by logit_bias, held by
  min_tokens) the grammar wins: the row takes its lowest allowed id. A row must allow at least one token.
  An all-ones row is bit-identical to an unmasked one (`where(True, x, -inf)` is `x`).
- `forced_token` >= 0 replaces the row's pick with that id (teacher-forced scoring); nothing else about
  the row changes.

Logprobs (our choice, stated once): `logprob` and `top_logprobs` are log_softmax of the **processed
logits** of step 2 — after bias, suppression and penalties, before temperature and the top-k/top-p/min-p
filters. They therefore describe the model's (penalised) distribution, not the truncated one a sampled
token was drawn from, and a greedy and a sampled row report the same numbers for the same token.
They are also taken *before* the grammar mask: a token the grammar forced reports the model's own
probability of it (not 0), top_logprobs may list tokens the grammar forbids, and a forced token reports
exactly what generation would have reported had it sampled that token.

vLLM v1 differs in two places, both deliberate here: it applies min_p before top-k/top-p, and its
default logprobs are of the raw logits (before bias and penalties).

Randomness: row r uses key fold_in(key(seed[r]), step[r]), so a token depends only on its own row's
seed, step and logits — never on which other rows share the batch or in what order (no key is split
across rows).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ember.compiler.kernels.fixed_order import fixed_order_log_softmax, fixed_order_logsumexp

GREEDY_EPSILON = 1e-5  # temperatures below this are greedy (as in vLLM): dividing by them overflows
# top-k/top-p look at this many best tokens per row first (lax.top_k) and sort the whole row only where
# that does not decide it: ~12 ms vs ~1 s for 16 rows of a 152k vocabulary on a 2-core CPU
CANDIDATE_WINDOW = 512


class SamplingBatch(NamedTuple):
    """Per-row sampling settings as device arrays; R rows, the last dims static per compiled plan."""

    temperature: jax.Array  # f32 [R]; 0 = greedy
    top_k: jax.Array  # i32 [R]; 0 = off
    top_p: jax.Array  # f32 [R]; 1 = off
    min_p: jax.Array  # f32 [R]; 0 = off
    repetition_penalty: jax.Array  # f32 [R]; 1 = off
    presence_penalty: jax.Array  # f32 [R]; 0 = off
    frequency_penalty: jax.Array  # f32 [R]; 0 = off
    seed: jax.Array  # u32 [R]
    step: jax.Array  # i32 [R]; index of the token being sampled among the row's generated tokens
    bias_ids: jax.Array  # i32 [R, MB]; -1 = empty slot
    bias_values: jax.Array  # f32 [R, MB]
    history_ids: jax.Array  # i32 [R, H]; prompt + output ids, -1 = empty slot
    history_is_output: jax.Array  # bool [R, H]; True for generated tokens
    suppress_ids: jax.Array  # i32 [R, S]; ids forced to -inf (min_tokens), -1 = empty slot
    allowed_mask: jax.Array  # i32 [R, ceil(V/32)]; grammar bitmask, bit j of word w = token 32w+j; -1 = all
    forced_token: jax.Array  # i32 [R]; the id this row must emit, -1 = pick as usual


class SampleResult(NamedTuple):
    tokens: jax.Array  # i32 [R]
    logprob: jax.Array  # f32 [R]; log_softmax(processed logits)[token]
    top_ids: jax.Array  # i32 [R, K]; the K most likely ids of the processed distribution, best first
    top_logprobs: jax.Array  # f32 [R, K]


def _scatter_ids(ids, vocab_size):
    # [R, n] ids with -1 (or anything out of range) for empty slots -> [R, n] ids where empty slots point
    # past the vocabulary, so scatters with mode="drop" skip them
    return jnp.where((ids >= 0) & (ids < vocab_size), ids, vocab_size)


def _rows(ids):
    return jnp.arange(ids.shape[0])[:, None]  # [R, 1], broadcasts against [R, n] column ids


def apply_bias_and_suppression(logits, params: SamplingBatch):
    """logits f32 [R, V] -> logits + logit_bias, with the row's suppressed ids at -inf."""
    vocab = logits.shape[-1]
    bias_ids = _scatter_ids(params.bias_ids, vocab)
    # the host packs each id once per row, so the add never accumulates duplicates
    logits = logits.at[_rows(bias_ids), bias_ids].add(params.bias_values.astype(jnp.float32), mode="drop")
    suppress = _scatter_ids(params.suppress_ids, vocab)
    return logits.at[_rows(suppress), suppress].set(-jnp.inf, mode="drop")


def _output_counts_sorted(history_ids, history_is_output):
    """History sorted by id, and for each slot how often its id was *generated* (output tokens only).

    Sorting the H-long history (instead of scattering counts into an [R, V] array, 256 MB at
    R=256, V=262k) keeps the work O(H log H) per row. Every slot of an id gets the same count, so a
    later scatter that writes all slots of an id writes one value, whatever the write order.
    """
    ids, is_out = jax.lax.sort((history_ids, history_is_output.astype(jnp.int32)), dimension=-1, num_keys=1)
    cum = jnp.cumsum(is_out, axis=-1)  # [R, H]
    cum = jnp.concatenate([jnp.zeros_like(cum[:, :1]), cum], axis=-1)  # [R, H+1]; cum[i] = outputs before i
    search = jax.vmap(lambda row: (jnp.searchsorted(row, row, side="left"), jnp.searchsorted(row, row, side="right")))
    first, past_last = search(ids)  # [R, H] each: the run of equal ids around every slot
    counts = jnp.take_along_axis(cum, past_last, -1) - jnp.take_along_axis(cum, first, -1)
    return ids, counts


def apply_penalties(logits, params: SamplingBatch):
    """logits f32 [R, V] -> logits with repetition, frequency and presence penalties applied.

    Only the (at most H) history ids of each row are touched: gather their logits, penalise, write back.
    Rows whose penalties are off write back exactly what they read.
    """
    vocab = logits.shape[-1]
    ids, out_counts = _output_counts_sorted(params.history_ids, params.history_is_output)  # [R, H] each
    write_ids = _scatter_ids(ids, vocab)
    seen = jnp.take_along_axis(logits, jnp.minimum(write_ids, vocab - 1), -1)  # [R, H]
    rep = params.repetition_penalty[:, None]
    penalised = jnp.where(seen > 0, seen / rep, seen * rep)  # prompt and output tokens (HF/vLLM)
    penalised = penalised - params.frequency_penalty[:, None] * out_counts.astype(jnp.float32)
    penalised = penalised - params.presence_penalty[:, None] * (out_counts > 0).astype(jnp.float32)
    return logits.at[_rows(write_ids), write_ids].set(penalised, mode="drop")


def process_logits(logits, params: SamplingBatch):
    """The processed logits f32 [R, V]: bias, suppression, penalties (what greedy and logprobs see)."""
    logits = logits.astype(jnp.float32)
    return apply_penalties(apply_bias_and_suppression(logits, params), params)


def _logsumexp(x, fixed_order: bool):
    # fixed_order: the sum in an order set by the row's length alone (fixed_order.py), what deterministic steps
    # need (XLA CPU's reduction rounds a row by how many rows it reduces beside it); otherwise XLA's reduction,
    # which a GPU runs in parallel (the fixed-order tree is one serial chain per row once XLA fuses it)
    return fixed_order_logsumexp(x, axis=-1) if fixed_order else jax.nn.logsumexp(x, axis=-1)


def _threshold_from_ranked(ranked, top_k, top_p, vocab, log_total, fixed_order: bool = False):
    """Top-k/top-p value threshold from the C best scaled logits of each row, and whether C sufficed.

    ranked f32 [R, C] (C <= V), largest first; log_total f32 [R] = logsumexp of the whole row (the
    top-p normaliser when top-k is off). Returns threshold [R, 1] (tokens below it are dropped) and
    exact [R]: True where the C values decide the row exactly (C == V always does).
    """
    window = ranked.shape[-1]
    k_on = (top_k > 0) & (top_k < vocab)
    k = jnp.where(k_on, top_k, vocab)
    kth = jnp.take_along_axis(ranked, (jnp.minimum(k, window) - 1)[:, None], -1)  # [R, 1]
    kth = jnp.where(k_on[:, None], kth, -jnp.inf)
    # top-p sees the top-k renormalised distribution; ties with the k-th value stay in, as in the mask
    in_top_k = jnp.where(ranked >= kth, ranked, -jnp.inf)
    log_norm = jnp.where(k_on, _logsumexp(in_top_k, fixed_order), log_total)[:, None]
    probs = jnp.exp(in_top_k - log_norm)  # [R, C]
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly better-ranked tokens
    mass_before = mass_before.at[:, 0].set(0.0)  # the top token is always kept
    kept = jnp.sum(mass_before < top_p[:, None], axis=-1)  # >= 1; a prefix of `ranked` since mass grows
    pth = jnp.take_along_axis(ranked, (kept - 1)[:, None], -1)
    # top_p == 1 must be an exact no-op: rounding can push the running sum to 1 before the tail
    pth = jnp.where((top_p < 1.0)[:, None], pth, -jnp.inf)
    if window == vocab:
        return jnp.maximum(kth, pth), jnp.ones(k.shape, bool)
    # the window decides a top-k row if it holds all k (ties included: its last value is below the k-th);
    # it decides a top-p-only row if the nucleus ends inside it
    k_exact = (k <= window) & (ranked[:, -1] < kth[:, 0])
    p_exact = (top_p >= 1.0) | (kept < window)
    return jnp.maximum(kth, pth), jnp.where(k_on, k_exact, p_exact)


def _top_k_top_p_threshold(scaled, top_k, top_p, window, fixed_order: bool = False):
    """Per-row threshold [R, 1] of top-k then top-p on temperature-scaled logits [R, V].

    First from the `window` best tokens of each row (lax.top_k: partial selection), which decides rows
    with a small top_k or a peaked nucleus; rows it cannot decide fall back to a full sort (taken only
    when some row needs it). Each row's path depends on its own values only, so the result is batch
    invariant. A GPU kernel will replace both with a radix/bucket threshold search.
    """
    vocab = scaled.shape[-1]
    log_total = _logsumexp(scaled, fixed_order)
    threshold, exact = _threshold_from_ranked(
        jax.lax.top_k(scaled, min(window, vocab))[0], top_k, top_p, vocab, log_total, fixed_order
    )
    full = jax.lax.cond(
        jnp.any(~exact),
        lambda s: _threshold_from_ranked(-jnp.sort(-s, axis=-1), top_k, top_p, vocab, log_total, fixed_order)[0],
        lambda s: threshold,
        scaled,
    )
    return jnp.where(exact[:, None], threshold, full)


def filter_logits(
    scaled, params: SamplingBatch, candidate_window: int = CANDIDATE_WINDOW, *, fixed_order: bool = False
):
    """Temperature-scaled logits f32 [R, V] -> the same with top-k, top-p and min-p drops at -inf."""
    vocab = scaled.shape[-1]
    wants_threshold = ((params.top_k > 0) & (params.top_k < vocab)) | (params.top_p < 1.0)
    # skip the selection altogether when no row asks for top-k/top-p (a batch-level branch: each row's
    # result is the same either way, because the filter is an exact no-op for "off" rows)
    threshold = jax.lax.cond(
        jnp.any(wants_threshold),
        lambda s: _top_k_top_p_threshold(s, params.top_k, params.top_p, candidate_window, fixed_order),
        lambda s: jnp.full((s.shape[0], 1), -jnp.inf, s.dtype),
        scaled,
    )
    # min-p: p_i < min_p * p_max  <=>  scaled_i < max + log(min_p); it compares probabilities with the
    # top one, so renormalising after top-k/top-p would not change it
    top = jnp.max(scaled, axis=-1, keepdims=True)
    min_p = params.min_p[:, None]
    mth = jnp.where(min_p > 0, top + jnp.log(jnp.where(min_p > 0, min_p, 1.0)), -jnp.inf)
    return jnp.where(scaled < jnp.maximum(threshold, mth), -jnp.inf, scaled)


def unpack_mask(mask, vocab):
    """Packed bitmask i32 [R, W] -> bool [R, vocab] (W * 32 >= vocab; bits past vocab are ignored)."""
    shifts = jnp.arange(32, dtype=jnp.int32)
    bits = (mask[:, :, None] >> shifts) & 1  # [R, W, 32]; arithmetic shift, so `& 1` reads bit j of words < 0 too
    return bits.reshape(mask.shape[0], -1)[:, :vocab].astype(bool)


def _first_allowed(mask):
    """The lowest allowed id of each row, from the packed mask i32 [R, W] -> i32 [R] (0 if none is)."""
    word = jnp.argmax(mask != 0, axis=-1)  # [R]; the first word with a bit set
    bits = jnp.take_along_axis(mask, word[:, None], -1)[:, 0]
    lowest = bits & -bits  # its lowest set bit alone (two's complement; bit 31 survives the wrap)
    return jnp.where(bits != 0, word * 32 + jax.lax.population_count(lowest - 1), 0).astype(jnp.int32)


def apply_mask(processed, allowed_mask):
    """processed f32 [R, V] with the tokens the packed mask forbids at -inf. Branch-free: one elementwise
    pass that fuses with its neighbours (a lax.cond skipping unmasked batches cost as much on CPU, and a
    GPU conditional adds a host sync)."""
    return jnp.where(unpack_mask(allowed_mask, processed.shape[-1]), processed, -jnp.inf)


def _row_gumbel(seed, step, vocab):
    # one row's noise [V]; the key depends on nothing but this row's seed and step
    key = jax.random.fold_in(jax.random.key(seed), step)
    return jax.random.gumbel(key, (vocab,), jnp.float32)


def sample(
    logits,
    params: SamplingBatch,
    num_top_logprobs: int = 0,
    *,
    candidate_window: int = CANDIDATE_WINDOW,
    all_greedy: bool = False,
    fixed_order: bool = False,
) -> SampleResult:
    """Pick one token per row. logits f32 [R, V]; num_top_logprobs (static, 0..20) sets K.

    Traceable with static shapes (call it inside the step's jit, or jit it with
    static_argnames=("num_top_logprobs", "candidate_window", "all_greedy", "fixed_order")). fixed_order
    (static; deterministic steps) sums the logprobs' normaliser and top-p's in a fixed order. candidate_window only trades
    speed: tokens do not depend on it. all_greedy (static) promises every row is greedy (temperature below
    GREEDY_EPSILON): the step then has no conditional at all — on a GPU each lax.cond makes the host wait
    for the device to reach it, which stops the host from preparing the next step meanwhile. The tokens
    are the ones the general path gives such a batch.
    """
    if fixed_order:
        # the sampler in fusions of its own, as tests/test_deterministic_ops_gpu.py checks it alone: inside a
        # step XLA may fuse its first elementwise ops (the temperature's division) into whatever produced the
        # logits, whose fusion (and rounding) can change with the step's row count
        logits = jax.lax.optimization_barrier(logits)
    processed = process_logits(logits, params)  # [R, V]
    rows, vocab = processed.shape
    # [R, V]; see the module docstring for this choice; fixed_order (deterministic steps): the sum in a fixed
    # order, a row's logprobs the same bits whatever the step's row count (docs/kernel_policy.md)
    logprobs = fixed_order_log_softmax(processed, axis=-1) if fixed_order else jax.nn.log_softmax(processed, axis=-1)

    constrained = apply_mask(processed, params.allowed_mask)  # [R, V]; what is picked from, not reported
    greedy = params.temperature < GREEDY_EPSILON  # [R]
    greedy_tokens = jnp.argmax(constrained, axis=-1).astype(jnp.int32)

    def draw(processed):
        temperature = jnp.where(greedy, 1.0, params.temperature)[:, None]
        # greedy rows ignore the filters: turn them off there so they cannot trigger a selection
        filters = params._replace(top_k=jnp.where(greedy, 0, params.top_k), top_p=jnp.where(greedy, 1.0, params.top_p))
        filtered = filter_logits(processed / temperature, filters, candidate_window, fixed_order=fixed_order)
        noise = jax.vmap(_row_gumbel, in_axes=(0, 0, None))(params.seed, params.step, vocab)  # [R, V]
        sampled = jnp.argmax(filtered + noise, axis=-1).astype(jnp.int32)  # Gumbel-max: a draw from softmax
        return jnp.where(greedy, greedy_tokens, sampled)

    # an all-greedy batch skips the noise (V random numbers per row); rows do not depend on the branch
    if all_greedy:
        tokens = greedy_tokens
    else:
        tokens = jax.lax.cond(jnp.all(greedy), lambda p: greedy_tokens, draw, constrained)
    # every allowed token at -inf (then so is the greedy pick): the grammar wins over bias/suppression
    stuck = jnp.take_along_axis(constrained, greedy_tokens[:, None], -1)[:, 0] == -jnp.inf
    tokens = jnp.where(stuck, _first_allowed(params.allowed_mask), tokens)
    tokens = jnp.where(params.forced_token >= 0, params.forced_token, tokens)

    chosen = jnp.take_along_axis(logprobs, tokens[:, None], -1)[:, 0]
    k = min(int(num_top_logprobs), vocab)
    if k > 0:
        top_logprobs, top_ids = jax.lax.top_k(logprobs, k)
    else:
        top_logprobs, top_ids = jnp.zeros((rows, 0), jnp.float32), jnp.zeros((rows, 0), jnp.int32)
    return SampleResult(tokens, chosen, top_ids.astype(jnp.int32), top_logprobs)
