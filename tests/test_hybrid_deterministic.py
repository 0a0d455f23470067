"""Deterministic mode on a tiny hybrid checkpoint (Gated DeltaNet layers with recurrent slot state, cpu target):
a sampled request's tokens and logprobs are bit-identical alone, beside other requests, prefilled in other
chunks, and resumed from a prefix-cache snapshot. The cpu plan's delta rule scans token by token whatever the
step holds (compiler/kernels/gated_delta/op.py), so only the batch-invariant kernels of the rest matter."""

import numpy as np
import pytest
from fixture_data import tiny_fixture
from test_hybrid_engine import ByteTokenizer

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams


@pytest.fixture(scope="module")
def qwen3_5():
    return load_model(tiny_fixture("qwen3_5")[0])


def _run(model, requests, *, max_batched_tokens=64):
    """Each request's (token ids, (logprob, top) per token) and cached tokens, submitted together."""
    config = EngineConfig(
        num_blocks=64,
        block_size=4,
        max_model_len=128,
        max_num_seqs=3,
        max_batched_tokens=max_batched_tokens,
        deterministic=True,
        enable_prefix_caching=max_batched_tokens > 16,  # off for the chunked runs: each computes the whole prompt
    )
    engine = Engine(model, ByteTokenizer(), config)
    try:
        results = []
        for group in requests:  # groups one after another (a later group may hit an earlier one's prefix)
            outs = [s.collect()[0] for s in [engine.submit(p, params) for p, params in group]]
            results += [
                (
                    [t for o in out for t in o.token_ids],
                    [(lp.logprob, lp.top) for o in out for lp in o.logprobs or ()],
                    out[-1].usage.cached_tokens,
                )
                for out in outs
            ]
    finally:
        engine.close()
    assert engine.kv.all_free() and engine.scheduler.extra_state["recurrent"].all_free()
    return results


def test_hybrid_deterministic_mode_is_bit_exact_alone_crowded_chunked_and_on_a_hit(qwen3_5):
    rng = np.random.default_rng(2)
    target = (
        rng.integers(3, 250, size=37).tolist(),
        SamplingParams(max_tokens=8, temperature=0.8, seed=3, logprobs=2, ignore_eos=True),
    )
    greedy = dict(temperature=0.0, ignore_eos=True)
    others = [(rng.integers(3, 250, size=n).tolist(), SamplingParams(max_tokens=6, **greedy)) for n in (50, 5)]
    # chunks of 36 and 1 (cut at the prompt's last block boundary), then the same prompt from the snapshot at 36
    cold, hit = _run(qwen3_5, [[target], [target]])
    # chunks of 16, 16 and 5 alone (no prefix cache); then beside decodes and other chunks
    runs = _run(qwen3_5, [[target], [others[0], target, others[1]]], max_batched_tokens=16)
    chunked, crowded = runs[0], runs[2]
    assert (cold[2], hit[2], chunked[2], crowded[2]) == (0, 36, 0, 0)
    for run in (hit, chunked, crowded):
        assert run[0] == cold[0]
        assert run[1] == cold[1]  # exact float equality
