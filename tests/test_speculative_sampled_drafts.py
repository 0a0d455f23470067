"""A draft model sampling its drafts inside the engine (tiny checkpoints, CPU): for a sampled request the drafter
draws from q (the draft model's logits through the request's own settings, seed and step) and the verifier
accepts with min(1, p/q). With the target as its own draft q equals p, so nearly every draft is accepted
(verified as point masses, as before, most would be rejected); a fixed seed reproduces the output; every KV
block comes back. The emitted distribution itself is tested in tests/kernels/speculative/test_draft_sample.py
(exactly, on a toy chain) and against plain sampling through the engine in the `slow` test below."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engine_support import ByteTokenizer
from fixture_data import tiny_fixture
from scipy.stats import chi2_contingency

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.engine.speculation import PlainDrafts
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig
from ember.runtime.speculative.model_drafter import ModelDrafter
from ember.runtime.speculative.stats import AcceptanceStats

PROMPT = [5, 17, 33, 9, 120, 7, 7, 64, 200, 3]
BASE = {"num_blocks": 64, "max_model_len": 128, "max_num_seqs": 4, "max_batched_tokens": 48, "decode_steps": 1}


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def _engine(model, k=3):
    spec = SpeculativeConfig("ngram", num_speculative_tokens=k, adaptive=False) if k else None
    return Engine(model, ByteTokenizer(), EngineConfig(**BASE, speculative=spec))


def _with_drafter(engine, draft_model, *, sampled=True):
    """The engine drafting with `draft_model` (sampled: the drafter is shown each row's sampling state)."""
    drafter = ModelDrafter(draft_model, engine.config, int(engine.model.dims.vocab))
    source = PlainDrafts(drafter)
    source.row_state = engine.requests.row_state if sampled else None
    engine.scheduler.draft_source, engine.scheduler.on_release = source, drafter.release
    return drafter


def _tokens(engine, params, prompt=PROMPT):
    return {i: [t for o in outs for t in o.token_ids] for i, outs in engine.submit(prompt, params).collect().items()}


def _accepted(engine, params):
    before = AcceptanceStats()
    before.merge(engine.counters.speculation)
    tokens = _tokens(engine, params)
    now = engine.counters.speculation
    return tokens, now.num_draft_tokens - before.num_draft_tokens, now.num_accepted_tokens - before.num_accepted_tokens


def _count_calls(drafter):
    """Counts the drafter's device calls: draw (d_0), draw_decodes (d_1..d_{k-1} in one call) and its steps."""
    calls = {"draw": 0, "draw_decodes": 0, "steps": 0, "k=1": 0}
    draw, draw_decodes, propose = drafter.steps.draw, drafter.steps.draw_decodes, drafter.propose

    def counted_draw(*args):
        calls["draw"] += 1
        return draw(*args)

    def counted_decodes(step, rows, steps, with_probs):
        calls["draw_decodes"] += 1
        calls["steps"] += steps
        return draw_decodes(step, rows, steps, with_probs)

    def counted_propose(context, k):
        draft = propose(context, k)
        calls["k=1"] += len(draft) == 1
        return draft

    drafter.steps.draw, drafter.steps.draw_decodes, drafter.propose = counted_draw, counted_decodes, counted_propose
    return calls


def _idle(engine, drafter):
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks
    engine.kv.check_consistency()
    assert drafter.sequences == {} and drafter.kv.all_free()


def test_sampled_drafts_of_the_target_itself_are_accepted_and_reproduce(qwen3):
    engine = _engine(qwen3)
    try:
        params = SamplingParams(max_tokens=12, temperature=1.0, seed=7, n=2, ignore_eos=True)
        drafter = _with_drafter(engine, qwen3)
        calls = _count_calls(drafter)
        first, drafted, accepted = _accepted(engine, params)
        # per proposal: one call for the catch-up chunk's draft, one for the k - 1 decodes after it (a scan)
        assert calls["draw_decodes"] > 0 and calls["draw"] == calls["draw_decodes"] + calls["k=1"]
        assert calls["steps"] == drafted - calls["draw"]
        again = _tokens(engine, params)
        assert first == again and all(len(t) == 12 for t in first.values())
        # q == p up to the verify segment's rounding: min(1, p/q) accepts nearly every draft. Verified as a point
        # mass a draft is accepted with probability p(d), a few percent on this flat 320-token p at T = 1 (the
        # tiny model's greedy drafts: 0 of 51 accepted for this request)
        assert drafted >= 8 and accepted >= 0.9 * drafted, (drafted, accepted)
        _idle(engine, drafter)
    finally:
        engine.close()


def _perturbed(model, scale, seed=0):
    """The model with every float weight scaled by (1 + scale * N(0, 1)): a draft near the target, not equal."""
    rng = np.random.default_rng(seed)

    def perturb(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return (x * (1 + scale * rng.standard_normal(x.shape))).astype(x.dtype)

    return replace(model, params=jax.tree.map(perturb, model.params))


def _verified_tokens(engine, seeds, temperature):
    """Output tokens 1..3 (what the first verify step emits: k = 2 drafts, then the target's) per seed, four
    requests at a time (none waits, so every step may draft)."""
    out = []
    for start in range(0, len(seeds), 4):
        streams = [
            engine.submit(PROMPT, SamplingParams(max_tokens=4, temperature=temperature, seed=int(s), ignore_eos=True))
            for s in seeds[start : start + 4]
        ]
        out += [[t for o in s.collect()[0] for t in o.token_ids][1:] for s in streams]
    return np.array(out)


@pytest.mark.slow  # ~1,600 requests through two engines (a minute or two on a shared CPU)
def test_sampled_speculation_matches_plain_sampling_in_distribution(qwen3):
    """A perturbed copy of the target as the draft (drafts accepted and rejected): output tokens 1..3 under
    speculation and under plain sampling (other seeds) have the same frequencies."""
    temperature, count = 0.5, 800  # a peaked distribution: few cells, enough draws per cell
    plain_engine, spec_engine = _engine(qwen3, k=0), _engine(qwen3, k=2)
    try:
        plain = _verified_tokens(plain_engine, np.arange(count), temperature)
        drafter = _with_drafter(spec_engine, _perturbed(qwen3, 0.05))
        spec = _verified_tokens(spec_engine, np.arange(count) + 10_000, temperature)
        stats = spec_engine.counters.speculation
        assert 0.3 * stats.num_draft_tokens < stats.num_accepted_tokens < 0.95 * stats.num_draft_tokens
        _idle(spec_engine, drafter)
    finally:
        plain_engine.close()
        spec_engine.close()
    for position in range(3):
        ids = sorted(set(plain[:, position]) | set(spec[:, position]))
        table = np.array([[np.sum(x[:, position] == i) for i in ids] for x in (plain, spec)])
        table = table[:, table.sum(0) >= 10]  # cells with too few draws say nothing
        assert chi2_contingency(table).pvalue > 1e-3, table
