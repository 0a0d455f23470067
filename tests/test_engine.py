"""Continuous batching over the real plans gives each request the tokens it gets alone (fp32, CPU)."""

import numpy as np

from ember.runtime.engine import Engine, EngineConfig
from ember.runtime.model import load_model
from ember.runtime.sequence_runner import SequenceRunner
from fixture_data import tiny_fixture


def _alone(model, prompt, max_tokens):
    runner = SequenceRunner(model, len(prompt) + max_tokens)
    logits, out = runner.prefill(prompt), []
    for _ in range(max_tokens):
        out.append(int(np.argmax(logits)))
        if len(out) < max_tokens:
            logits = runner.decode(out[-1])
    return out


def test_concurrent_greedy_requests_match_running_alone():
    path, _ = tiny_fixture("qwen3")
    model = load_model(path)
    rng = np.random.default_rng(1)
    cases = [(rng.integers(3, 250, size=n).tolist(), m) for n, m in ((5, 12), (40, 7), (77, 20), (17, 9), (130, 5))]
    engine = Engine(model, EngineConfig(num_blocks=64, max_num_seqs=4, max_batched_tokens=48))
    try:
        streams = [engine.submit(prompt, max_tokens=m) for prompt, m in cases]
        results = [s.token_ids() for s in streams]
    finally:
        engine.close()
    for (prompt, m), got in zip(cases, results):
        assert got == _alone(model, prompt, m)
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks


def test_abort_frees_blocks():
    path, _ = tiny_fixture("qwen2")
    model = load_model(path)
    engine = Engine(model, EngineConfig(num_blocks=32, max_num_seqs=2, max_batched_tokens=32))
    try:
        stream = engine.submit(list(range(3, 60)), max_tokens=200)
        first = next(iter(stream))
        assert first.new_token_ids
        assert engine.abort(stream.request.request_id)
        assert stream.finish_reason == "abort"
        engine.submit([5, 6, 7], max_tokens=2).token_ids()  # the engine goes on serving
    finally:
        engine.close()
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks
