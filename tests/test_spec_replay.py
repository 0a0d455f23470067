"""The replay drafter (tools/dev/spec_replay.py): it plays back recorded per-position acceptance. Alone, its
drafts have the profile's rates (tens of thousands of proposals, bounds of a few standard errors); inside the
engine (tiny checkpoint, CPU) the real verify accepts exactly the drafts it meant to be right, the output is
plain greedy decoding's, and the engine's own per-position acceptance follows the profile."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from engine_support import GREEDY, ByteTokenizer
from fixture_data import tiny_fixture

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig
from ember.runtime.speculative.drafter import DraftContext
from ember.tools.dev.bench_speculative_gpu import PROFILES
from ember.tools.dev.spec_replay import ReplayDrafter, ReplayProfile, load_profiles

PROFILE = ReplayProfile(0.6, (1.0, 0.9, 0.7, 0.5), (0.9, 0.5, 0.8, 0.3), "test")


def _within(observed: int, total: int, rate: float, sigmas: float = 4.5) -> bool:
    """observed / total is rate within `sigmas` binomial standard errors (and one count)."""
    return abs(observed / total - rate) <= sigmas * math.sqrt(rate * (1 - rate) / total) + 1 / total


def test_profiles_are_read_from_the_committed_cpu_measurement():
    profiles = load_profiles(PROFILES)
    summary = json.loads(PROFILES.read_text())["summary"]
    names = {"ngram": "ngram min_match=2 max_match=4", "draft": "draft qwen2.5-coder-0.5b-instruct (greedy)"}
    for workload, label, k in [("code_editing", "ngram", 4), ("code_editing", "draft", 8), ("free_form", "draft", 4)]:
        profile = profiles[(workload, label, k)]
        (row,) = [s for s in summary if (s["workload"], s["drafter"], s["k"]) == (workload, names[label], k)]
        assert profile.k == k
        assert np.allclose(profile.acceptance, row["acceptance_rate_per_position"], atol=1e-4)
        # tokens per step = 1 + draft_rate * mean accepted per drafting step
        accepted = sum(np.cumprod(profile.acceptance) * np.asarray(profile.length_survival))
        assert abs(1 + profile.draft_rate * accepted - row["mean_tokens_per_step"]) < 0.05
    assert ("code_editing", "ngram min_match=1", 8) in profiles


def test_profile_from_counts_fixed_and_capped():
    counts = {
        "steps": 10,
        "num_drafts": 4,
        "drafted_per_position": [4, 2],
        "accepted_per_position": [3, 1],
        "reached_per_position": [4, 2],
    }
    profile = ReplayProfile.from_counts(counts)
    assert (profile.draft_rate, profile.length_survival, profile.acceptance) == (0.4, (1.0, 0.5), (0.75, 0.5))
    assert ReplayProfile.fixed(3).acceptance == (0.0, 0.0, 0.0) and PROFILE.capped(2).acceptance == (0.9, 0.5)
    with pytest.raises(ValueError):
        ReplayProfile(1.2, (1.0,), (0.5,))


def test_the_drafters_proposals_have_the_profiles_rates():
    reference = list(np.random.default_rng(0).integers(0, 500, 200))
    drafter = ReplayDrafter(PROFILE, vocab=500, seed=1)
    drafter.record([7, 8], reference)
    rng = np.random.default_rng(2)
    proposals, lengths = 20_000, np.zeros(5, int)
    reached, accepted = np.zeros(4, int), np.zeros(4, int)
    for index in range(proposals):
        done = int(rng.integers(0, 100))
        draft = drafter.propose(DraftContext(f"r{index}", (7, 8), tuple(reference[:done])), 4).token_ids
        lengths[len(draft)] += 1
        right = [t == reference[done + i] for i, t in enumerate(draft)]
        for i in range(len(draft)):
            reached[i] += all(right[:i])
            accepted[i] += all(right[: i + 1])
    drafted = proposals - lengths[0]
    assert _within(drafted, proposals, PROFILE.draft_rate)
    for i, survival in enumerate(PROFILE.length_survival):
        assert (
            _within(int(lengths[i + 1 :].sum()), drafted, survival)
            if survival < 1
            else lengths[i + 1 :].sum() == drafted
        )
    for i, rate in enumerate(PROFILE.acceptance):
        assert _within(int(accepted[i]), int(reached[i]), rate), (i, accepted[i] / reached[i], rate)
    assert drafter.intended.accepted_per_position == accepted.tolist()
    # a request whose output left its recorded continuation gets no drafts from there on, nor one with none
    assert drafter.off_reference == 0
    follows = DraftContext("x", (7, 8), tuple(reference[:5]))
    left = DraftContext("x", (7, 8), (*reference[:5], reference[5] + 1))
    assert drafter.propose(left, 4).token_ids == () and drafter.off_reference == 1
    assert drafter.propose(follows, 4).token_ids == () and drafter.off_reference == 2  # it stays off
    assert drafter.propose(DraftContext("y", (9,), ()), 4).token_ids == () and drafter.off_reference == 3
    drafter.release("x")  # a request coming back (preempted) is looked up afresh
    drafter.propose(follows, 4)
    assert drafter.off_reference == 3


@pytest.fixture(scope="module")
def qwen3():
    return load_model(tiny_fixture("qwen3")[0])


def _engine(model, drafter=None):
    spec = SpeculativeConfig("ngram", num_speculative_tokens=4, adaptive=False) if drafter else None
    config = EngineConfig(
        num_blocks=96, max_model_len=128, max_num_seqs=4, max_batched_tokens=64, decode_steps=1, speculative=spec
    )
    return Engine(model, ByteTokenizer(), config, drafter=drafter)


def _run(engine, prompts, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, **GREEDY)
    streams = [engine.submit(p, params) for p in prompts]
    return [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]


def test_in_the_engine_the_verify_accepts_exactly_the_replayed_drafts(qwen3):
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 250, size=n).tolist() for n in (7, 11, 13, 17)]
    plain = _engine(qwen3)
    try:
        reference = _run(plain, prompts, 60)
    finally:
        plain.close()
    profile = ReplayProfile(1.0, (1.0,) * 4, (0.7, 0.6, 0.9, 0.5))
    drafter = ReplayDrafter(profile, vocab=int(qwen3.dims.vocab), seed=3)
    for p, tokens in zip(prompts, reference):
        drafter.record(p, tokens)
    engine = _engine(qwen3, drafter)
    try:
        assert _run(engine, prompts, 60) == reference  # greedy: the drafts change no token
        stats = engine.speculation_stats()
    finally:
        engine.close()
    intended = drafter.intended
    assert stats.num_drafts > 50 and drafter.off_reference == 0
    assert stats.drafted_per_position == intended.drafted_per_position
    assert stats.accepted_per_position == intended.accepted_per_position
    for i, rate in enumerate(profile.acceptance):
        assert _within(stats.accepted_per_position[i], stats.reached_per_position[i], rate), i


def test_a_drafter_needs_a_speculative_config(qwen3):
    with pytest.raises(ValueError, match="speculative"):
        Engine(qwen3, ByteTokenizer(), EngineConfig(num_blocks=16), drafter=ReplayDrafter(PROFILE, 10))
