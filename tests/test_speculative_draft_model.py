"""The `draft` drafter in the engine (tiny checkpoints, CPU): a draft model drafting for a target gives exactly
the target's plain greedy tokens, whether it agrees with the target (itself as its draft: every draft
accepted) or not (another model: drafts rejected, its KV rolled back); its KV all goes back at the end."""

from dataclasses import replace

import pytest
from engine_support import GREEDY, ByteTokenizer
from fixture_data import tiny_fixture

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig

PROMPTS = ([5, 17, 33, 9, 120, 7, 7, 64], [200, 3, 90, 91, 92, 93, 14, 15, 16, 250, 1])
CONFIG = EngineConfig(num_blocks=48, max_model_len=128, max_num_seqs=2, max_batched_tokens=32, decode_steps=1)


def _outputs(model, speculative, max_tokens=12):
    engine = Engine(model, ByteTokenizer(), replace(CONFIG, speculative=speculative))
    try:
        streams = [engine.submit(list(p), SamplingParams(max_tokens=max_tokens, **GREEDY)) for p in PROMPTS]
        tokens = [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]
        stats = engine.speculation_stats()
        drafter = engine.drafter
    finally:
        engine.close()
    if drafter is not None:
        assert drafter.sequences == {} and drafter.kv.all_free()
    return tokens, stats


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return path, load_model(path)


@pytest.mark.slow  # three engines and two draft executors to compile (~1-2 min on a shared CPU)
def test_a_draft_model_gives_the_targets_greedy_tokens(qwen3):
    path, model = qwen3
    plain, _ = _outputs(model, None)
    itself, agreeing = _outputs(model, SpeculativeConfig("draft", 3, draft_model=str(path), adaptive=False))
    other_path, _ = tiny_fixture("qwen2")
    other, disagreeing = _outputs(model, SpeculativeConfig("draft", 3, draft_model=str(other_path), adaptive=False))
    assert itself == plain and other == plain
    assert agreeing.num_draft_tokens > 0 and agreeing.num_accepted_tokens == agreeing.num_draft_tokens
    assert disagreeing.num_draft_tokens > disagreeing.num_accepted_tokens


def test_precompile_covers_the_draft_models_calls(qwen3):
    """After Engine.precompile a draft model drafts without compiling: its catch-up chunks (a 40-token prompt goes
    as a full 32-token chunk, then the last 8 tokens' chunk), its chained decodes and the q a sampled row needs."""
    path, model = qwen3
    speculative = SpeculativeConfig("draft", 3, draft_model=str(path), adaptive=False)
    engine = Engine(model, ByteTokenizer(), replace(CONFIG, speculative=speculative))
    try:
        engine.precompile()
        prompt = list(range(3, 43))
        for params in (SamplingParams(max_tokens=8, **GREEDY), SamplingParams(max_tokens=8, temperature=0.7, seed=1)):
            engine.submit(prompt, params).collect()
        drafter = engine.drafter
        stats = engine.speculation_stats()
    finally:
        engine.close()
    assert stats.num_draft_tokens > 0
    calls = (drafter.steps.step_fn, drafter.steps.decodes_fn, drafter.executor.step_fn)
    assert [fn.compiled_on_call for fn in calls] == [0, 0, 0]
