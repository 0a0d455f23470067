"""Speculation in deterministic mode on the cpu target (its deterministic policy is bucketed: every kernel of the
deterministic plan computes a row the same way at every shape from min_rows rows, docs/kernel_policy.md "Batch
invariance"): a verify segment's rows give exactly a decode row's logits bits, so speculative decoding reports
plain deterministic decoding's tokens and logprobs bit for bit — greedy rows (the same tokens), seeded sampled
rows (each emitted token's logprob is the one plain decoding reports for it, teacher-forced), alone and beside
other rows. Targets whose deterministic steps run in fixed tiles keep refusing."""

from dataclasses import replace

import numpy as np
import pytest
from engine_support import GREEDY, ByteTokenizer
from fixture_data import tiny_fixture

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig

BASE = {"num_blocks": 64, "max_model_len": 256, "max_num_seqs": 4, "max_batched_tokens": 48, "decode_steps": 1}
TOKENS = 10


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def _engine(model, speculative: bool):
    spec = SpeculativeConfig("ngram", num_speculative_tokens=3, adaptive=False) if speculative else None
    return Engine(model, ByteTokenizer(), EngineConfig(**BASE, deterministic=True, speculative=spec))


@pytest.fixture(scope="module")
def engines(qwen3):
    plain, spec = _engine(qwen3, False), _engine(qwen3, True)
    yield plain, spec
    plain.close()
    spec.close()


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(3, 250, size=n).tolist() * 3 for n in (4, 6)] + [rng.integers(3, 250, size=7).tolist()]


def _run(engine, jobs):
    """jobs: (prompt, params, prediction ids) run together -> per job (tokens, logprobs)."""
    streams = [engine.submit(p, params, prediction_ids=pred) for p, params, pred in jobs]
    out = []
    for stream in streams:
        outputs = stream.collect()[0]
        logprobs = [lp for o in outputs for lp in o.logprobs]  # TokenLogprob: token, logprob, top alternatives
        out.append(([t for o in outputs for t in o.token_ids], logprobs))
    return out


def _params(sampled: bool, **kw) -> SamplingParams:
    settings = {"temperature": 0.3, "seed": 7} if sampled else GREEDY
    return SamplingParams(**{"max_tokens": TOKENS, "ignore_eos": True, "logprobs": 2, **settings, **kw})


def _drafts(spec) -> int:
    return spec.counters.speculation.num_draft_tokens


class AlwaysDrafts:
    """The engine's lookup drafts, else k tokens that depend on the request's tokens only (mostly rejected):
    every decode row drafts, whatever its neighbours."""

    def __init__(self, source, vocab: int):
        self.source, self.vocab, self.release = source, vocab, source.release

    def __call__(self, request, k):
        drafts = tuple(self.source(request, k).token_ids)
        last = request.all_token_ids[-1]
        return drafts or tuple((last * 7 + 3 * i + 1) % self.vocab for i in range(k))


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_verify_rows_give_decode_rows_bits(engines, prompts, sampled):
    plain, spec = engines
    wanted = _run(plain, [(prompts[0], _params(sampled), ())])[0][0]
    # an exact prediction (all or, sampled, some accepted), a wrong one, lookup or filler drafts
    jobs = [(p, _params(sampled), pred) for p, pred in zip(prompts, (tuple(wanted), tuple(range(3, 13)), ()))]
    saved, spec.scheduler.draft_source = spec.scheduler.draft_source, AlwaysDrafts(spec.scheduler.draft_source, 256)
    stats = spec.counters.speculation
    drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
    try:
        beside = _run(spec, jobs)  # three rows in every step
        alone = [_run(spec, [job])[0] for job in jobs]
    finally:
        spec.scheduler.draft_source = saved
    assert stats.num_draft_tokens - drafted > stats.num_accepted_tokens - accepted > 0
    if not sampled:
        assert beside == alone  # bit-equal logprobs: == on floats
    # a sampled row's tokens depend on its drafts (rejection sampling keeps the distribution, not the draws),
    # and which steps draft depends on its neighbours (no row drafts beside a prefill): its logprobs do not
    for (prompt, params, _), (tokens, logprobs) in zip(jobs + jobs, beside + alone):
        if sampled:  # plain decoding's logprobs for the same tokens (teacher-forced), bit for bit
            forced = replace(params, forced_token_ids=tuple(tokens))
            assert _run(plain, [(prompt, forced, ())])[0] == (tokens, logprobs)
        else:
            assert _run(plain, [(prompt, params, ())])[0] == (tokens, logprobs)


def test_an_exact_prediction_is_accepted_with_plain_bits(engines, prompts):
    """Every draft accepted: whole segments of verify rows, still plain decoding's bits."""
    plain, spec = engines
    want = _run(plain, [(prompts[2], _params(False), ())])[0]
    stats = spec.counters.speculation
    drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
    assert _run(spec, [(prompts[2], _params(False), tuple(want[0]))])[0] == want
    assert stats.num_draft_tokens - drafted == stats.num_accepted_tokens - accepted > 0


def test_fixed_tile_targets_still_refuse(qwen3):
    """A target whose deterministic steps run in fixed tiles (the h200 until a670c0d) refuses, naming why."""
    policy = qwen3.policy
    tiled = replace(qwen3, policy=replace(policy, deterministic=replace(policy.deterministic, bucketed=False)))
    with pytest.raises(ValueError, match="fixed shape"):
        _engine(tiled, True)
