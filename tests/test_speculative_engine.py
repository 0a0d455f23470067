"""Speculative decoding inside the engine (tiny checkpoint, CPU): greedy speculation gives exactly plain
decoding's tokens whatever the drafts (all accepted, none accepted, Predicted Outputs); seeded sampling
reproduces; stops and max_tokens never overshoot; every KV block comes back after aborts; unsupported
combinations are refused."""

import numpy as np
import pytest
from engine_support import GREEDY, ByteTokenizer
from fixture_data import tiny_fixture

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.engine.speculation import draft_source
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig
from ember.runtime.speculative.model_drafter import ModelDrafter
from ember.runtime.speculative.stats import AcceptanceStats


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def _engine(model, k=4, **kw):
    # fixed k (adaptive k, tested in test_speculative_adaptive_source.py, would make the draft counts vary)
    spec = SpeculativeConfig("ngram", num_speculative_tokens=k, adaptive=False) if k else None
    base = {"num_blocks": 64, "max_model_len": 256, "max_num_seqs": 4, "max_batched_tokens": 48, "decode_steps": 1}
    return Engine(model, ByteTokenizer(), EngineConfig(**{**base, **kw}, speculative=spec))


def _run(engine, jobs):
    """jobs: (prompt, params, prediction ids); -> per job its choice 0's tokens and final output."""
    streams = [engine.submit(p, params, prediction_ids=pred) for p, params, pred in jobs]
    out = []
    for stream in streams:
        outs = stream.collect()[0]
        out.append(([t for o in outs for t in o.token_ids], outs[-1]))
    return out


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(3)
    # repetitive prompts give the n-gram drafter something to find
    base = [rng.integers(3, 250, size=n).tolist() for n in (6, 9, 13)]
    return [b * 3 for b in base] + [rng.integers(3, 250, size=11).tolist()]


@pytest.fixture(scope="module")
def plain(qwen3, prompts):
    engine = _engine(qwen3, k=0)
    try:
        return [t for t, _ in _run(engine, [(p, SamplingParams(max_tokens=14, **GREEDY), ()) for p in prompts])]
    finally:
        engine.close()


@pytest.fixture(scope="module")
def spec(qwen3):
    """One speculating engine (k = 4) for the tests below: its verify executables compile once."""
    engine = _engine(qwen3)
    yield engine
    engine.close()


def _stats_after(engine, jobs):
    before = AcceptanceStats()
    before.merge(engine.counters.speculation)
    out = _run(engine, jobs)
    now = engine.counters.speculation
    return out, {
        n: getattr(now, n) - getattr(before, n) for n in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
    }


def _idle(engine):
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks
    engine.kv.check_consistency()


def test_greedy_speculation_matches_plain_decoding(spec, prompts, plain):
    """Lookup drafts, an exact Predicted Output (everything accepted), a wrong one (nothing accepted)."""
    params = SamplingParams(max_tokens=14, **GREEDY)
    lookup = _run(spec, [(p, params, ()) for p in prompts])
    exact, accepted = _stats_after(spec, [(p, params, tuple(t)) for p, t in zip(prompts, plain)])
    truth = {tuple(p): t for p, t in zip(prompts, plain)}

    def wrong_drafts(request, k):  # never the target's next token
        done = len(request.output_token_ids)
        return [(t + 1) % 250 for t in truth[tuple(request.prompt_token_ids)][done : done + k]]

    source, spec.scheduler.draft_source = spec.scheduler.draft_source, wrong_drafts
    try:
        wrong, rejected = _stats_after(spec, [(p, params, ()) for p in prompts])
    finally:
        spec.scheduler.draft_source = source
    for runs in (lookup, exact, wrong):
        assert [t for t, _ in runs] == plain
        assert all(o.finish_reason == "length" and o.usage.completion_tokens == 14 for _, o in runs)
    assert accepted["num_drafts"] > 0 and accepted["num_accepted_tokens"] == accepted["num_draft_tokens"]
    assert rejected["num_draft_tokens"] > 0 and rejected["num_accepted_tokens"] == 0
    _idle(spec)


def test_exact_prediction_is_accepted_whole(spec, prompts, plain):
    ((_, final),) = _run(spec, [(prompts[3], SamplingParams(max_tokens=14, **GREEDY), tuple(plain[3]))])
    _, stats = _stats_after(spec, [(prompts[3], SamplingParams(max_tokens=14, **GREEDY), tuple(plain[3]))])
    # 14 tokens: the prefill's first, then verify steps of 4, 4 and (max_tokens caps k) 2 drafts, all accepted
    assert stats == {"num_drafts": 3, "num_draft_tokens": 10, "num_accepted_tokens": 10}


def test_stops_and_max_tokens_never_overshoot(spec, prompts, plain):
    """A stop id in the middle of accepted drafts ends the output right there; max_tokens caps k."""
    for stop_at in (2, 3, 7):
        stop_id = plain[3][stop_at]
        first = plain[3].index(stop_id)
        params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_id])
        ((tokens, final),) = _run(spec, [(prompts[3], params, tuple(plain[3]))])
        assert tokens == plain[3][: first + 1] and final.finish_reason == "stop"
    for max_tokens in (2, 3, 6):
        short = SamplingParams(max_tokens=max_tokens, **GREEDY)
        ((capped, capped_final),) = _run(spec, [(prompts[3], short, tuple(plain[3]))])
        assert capped == plain[3][:max_tokens] and capped_final.finish_reason == "length"
    _idle(spec)


def test_seeded_sampling_reproduces_with_n_and_logprobs(spec, prompts):
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=11, n=2, logprobs=2, ignore_eos=True)
    runs = [spec.submit(prompts[0], params).collect() for _ in range(2)]
    tokens = [{i: [t for o in outs for t in o.token_ids] for i, outs in run.items()} for run in runs]
    assert tokens[0] == tokens[1] and all(len(v) == 10 for v in tokens[0].values())
    for outs in runs[0].values():
        logprobs = [lp for o in outs if o.logprobs for lp in o.logprobs]
        assert [lp.token_id for lp in logprobs] == [t for o in outs for t in o.token_ids]
        assert all(lp.logprob <= 0.0 and len(lp.top) == 2 for lp in logprobs)


def test_aborts_return_every_block(spec, prompts, plain):
    rng = np.random.default_rng(5)
    streams = []
    for i in range(6):
        params = SamplingParams(max_tokens=20, **GREEDY)
        streams.append(spec.submit(prompts[i % 4], params, prediction_ids=tuple(plain[i % 4])))
        if rng.random() < 0.6:
            spec.abort(streams[-1].request_id)
    for s in streams:
        s.collect()
    _idle(spec)


def test_deterministic_mode_is_refused_where_steps_run_in_fixed_tiles(qwen3):
    """The cpu target's deterministic steps are bucketed (speculation allowed there:
    tests/test_speculative_deterministic.py); a fixed-tile target's (the h200's) refuse."""
    from dataclasses import replace

    policy = qwen3.policy
    tiled = replace(qwen3, policy=replace(policy, deterministic=replace(policy.deterministic, bucketed=False)))
    with pytest.raises(ValueError, match="deterministic"):
        _engine(tiled, deterministic=True)


def test_batch_one_verify_shapes_are_compiled_ahead(spec):
    shapes = spec.executor.verify_shapes_alone()
    assert [s.verify_width for s in shapes] == [2, 3, 4, 5]  # k = 4: up to 5 tokens per segment
    assert all(s.decode_rows == 0 and s.segments == 1 and s.logit_rows == s.verify_width for s in shapes)
    with spec._lock:  # the loop is idle: run one ahead-of-time compile the way precompile does
        spec.executor._precompile_verify(shapes[0], all_greedy=True)


def test_a_draft_model_drafting_for_its_own_target_is_accepted_whole(spec, qwen3, prompts, plain):
    """The draft drafter's mechanics in CI: the target as its own draft model agrees on every greedy token."""
    drafter = ModelDrafter(qwen3, spec.config, int(qwen3.dims.vocab))
    source, release = spec.scheduler.draft_source, spec.scheduler.on_release
    spec.scheduler.draft_source, spec.scheduler.on_release = draft_source(drafter), drafter.release
    try:
        runs, stats = _stats_after(spec, [(prompts[1], SamplingParams(max_tokens=10, **GREEDY), ())])
    finally:
        spec.scheduler.draft_source, spec.scheduler.on_release = source, release
    assert runs[0][0] == plain[1][:10]
    assert stats["num_draft_tokens"] > 0 and stats["num_accepted_tokens"] == stats["num_draft_tokens"]
    assert drafter.sequences == {} and drafter.kv.all_free()


class _NoDraftsPlanned:
    """A draft source whose plan drafts for nobody (an adaptive source at a batch where verifying does not pay)."""

    def __init__(self, source):
        self.source, self.release = source, getattr(source, "release", None)

    def plan(self, requests):
        return {r.request_id: 0 for r in requests}

    def __call__(self, request, k):
        return self.source(request, k)


def test_run_ahead_targets_still_draft_and_run_ahead_once_nobody_is_drafted_for(qwen3, prompts, plain):
    """A target that runs several decode steps per call (the h200's decode_steps) schedules each decode call
    afresh while its source drafts, so the drafts are taken (a run-ahead call carries none); when the source
    plans no drafts, its decode calls run ahead again. Tokens equal plain decoding's either way."""
    engine = _engine(qwen3, decode_steps=4)
    try:
        assert engine.executor.decode_steps == 4
        jobs = [(p, SamplingParams(max_tokens=14, **GREEDY), ()) for p in prompts]
        drafted, stats = _stats_after(engine, jobs)
        assert [t for t, _ in drafted] == plain
        assert stats["num_draft_tokens"] > 0
        calls, steps = engine.counters.device_calls, engine.counters.steps
        engine.scheduler.draft_source = _NoDraftsPlanned(engine.scheduler.draft_source)
        undrafted, stats = _stats_after(engine, jobs)
        assert [t for t, _ in undrafted] == plain and stats["num_draft_tokens"] == 0
        assert engine.counters.steps - steps > engine.counters.device_calls - calls  # several steps per call
        _idle(engine)
    finally:
        engine.close()
