"""Run-ahead (several decode steps per device call, runtime/scheduling/run_ahead.py) on a tiny hybrid checkpoint:
the recurrent slot state is carried from step to step inside the call, so concurrent requests that end at
different steps (some run-ahead steps discarded) give the tokens and logprobs of one step per call."""

import numpy as np
from fixture_data import tiny_fixture
from test_hybrid_engine import ByteTokenizer

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams


def _serve(model, decode_steps, requests):
    config = EngineConfig(
        num_blocks=64, block_size=4, max_model_len=96, max_num_seqs=2, max_batched_tokens=64, decode_steps=decode_steps
    )
    engine = Engine(model, ByteTokenizer(), config)
    calls = []
    launch = engine.executor.launch

    def counted(step, rows, steps, **kw):
        calls.append(steps)
        return launch(step, rows, steps, **kw)

    engine.executor.launch = counted
    try:
        outs = [s.collect()[0] for s in [engine.submit(p, params) for p, params in requests]]
    finally:
        engine.close()
    assert engine.kv.all_free() and engine.scheduler.extra_state["recurrent"].all_free()
    return [
        ([t for o in out for t in o.token_ids], [lp.logprob for o in out for lp in o.logprobs]) for out in outs
    ], calls


def test_run_ahead_gives_the_tokens_of_one_step_per_call():
    model = load_model(tiny_fixture("qwen3_5")[0])
    rng = np.random.default_rng(9)
    requests = [
        (
            rng.integers(3, 250, size=n).tolist(),
            SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True, logprobs=0),
        )
        for n, m in ((9, 13), (21, 6))
    ]
    ahead, calls = _serve(model, 4, requests)
    assert 4 in calls  # decode steps did run ahead
    one, calls = _serve(model, 1, requests)
    assert set(calls) == {1}
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(ahead, one):
        assert tokens == want_tokens
        np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-5)
