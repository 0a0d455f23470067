"""Speculative decoding on an NVIDIA GPU (the h200 target's plans; tiny checkpoints): a hybrid (qwen3_5) rolls
rejected drafts' recurrent state back (there several rows' recomputations share a step: the GPU plans compile
multi-chunk layouts), and a draft model sampling its drafts with their q (qwen3 as its own draft) has nearly
every draft accepted and a seeded output that reproduces.

Run on the GPU machine:
    JAX_PLATFORMS=cuda,cpu python -m pytest -q -m gpu tests/test_gpu_speculative.py
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda,cpu)", allow_module_level=True)

from engine_support import GREEDY, ByteTokenizer, all_outputs_of, assert_same_up_to_a_near_tie  # noqa: E402
from fixture_data import tiny_fixture  # noqa: E402

from ember.runtime.engine.engine import Engine, EngineConfig  # noqa: E402
from ember.runtime.engine.speculation import PlainDrafts  # noqa: E402
from ember.runtime.loading.model import load_model  # noqa: E402
from ember.runtime.sampling.params import SamplingParams  # noqa: E402
from ember.runtime.speculative.config import SpeculativeConfig  # noqa: E402
from ember.runtime.speculative.model_drafter import ModelDrafter  # noqa: E402

pytestmark = pytest.mark.gpu
BASE = {"num_blocks": 96, "max_model_len": 256, "max_num_seqs": 4, "max_batched_tokens": 64}


def _engine(model):
    spec = SpeculativeConfig("ngram", num_speculative_tokens=3, adaptive=False)
    return Engine(model, ByteTokenizer(), EngineConfig(**BASE, speculative=spec))


def _run(engine, prompts, params):
    streams = [engine.submit(p, params) for p in prompts]
    return [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]


def test_a_hybrid_rolls_rejected_drafts_back_on_the_gpu():
    model = load_model(tiny_fixture("qwen3_5")[0], target="h200", with_mtp=False)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 250, size=n).tolist() for n in (9, 12, 15, 20)]
    params = SamplingParams(max_tokens=16, logprobs=2, **GREEDY)
    engine = _engine(model)
    try:
        engine.scheduler.draft_source = lambda request, k: ()
        plain_outputs = all_outputs_of(engine, [(p, params) for p in prompts])
        plain = [tokens for tokens, _ in plain_outputs]

        def wrong_drafts(request, k):
            expected = plain[prompts.index(list(request.prompt_token_ids))][len(request.output_token_ids)]
            return [(expected + 1 + i) % int(model.dims.vocab) for i in range(k)]

        engine.scheduler.draft_source = wrong_drafts
        before = engine.counters.speculation.num_draft_tokens
        # the verify segments' bf16 logits may round a near-tie the other way than the decode rows' (not
        # deterministic mode); a row that took the runner-up there drafts nonsense from then on, and is done
        for got, want in zip(_run(engine, prompts, params), plain_outputs):
            assert_same_up_to_a_near_tie(got, want)
        assert engine.counters.speculation.num_draft_tokens > before
        assert engine.counters.speculation.num_accepted_tokens == 0
        assert engine.pool.free_blocks == engine.pool.num_usable_blocks
    finally:
        engine.close()


def test_sampled_drafts_with_their_q_on_the_gpu():
    model = load_model(tiny_fixture("qwen3")[0], target="h200")
    engine = _engine(model)
    try:
        drafter = ModelDrafter(model, engine.config, int(model.dims.vocab))
        source = PlainDrafts(drafter)
        source.row_state = engine.requests.row_state
        engine.scheduler.draft_source, engine.scheduler.on_release = source, drafter.release
        params = SamplingParams(max_tokens=16, temperature=1.0, seed=5, ignore_eos=True)
        first = _run(engine, [[5, 17, 33, 9, 120, 7]], params)
        stats = engine.counters.speculation
        assert _run(engine, [[5, 17, 33, 9, 120, 7]], params) == first
        assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens >= 0.9 * stats.num_draft_tokens
        assert drafter.sequences == {} and drafter.kv.all_free()
    finally:
        engine.close()
