"""The engine over real plans (tiny checkpoints, CPU): continuous batching gives each request what it
gets alone; n, logprobs, stop strings, abort and capacity behave; KV is all returned."""

import numpy as np
import pytest
from engine_support import GREEDY, ByteTokenizer
from fixture_data import tiny_fixture

from ember.compiler.targets import get_target
from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.scheduling.requests import QueueFullError


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def _alone(model, prompt, max_tokens, kv_dtype=None):
    runner = SequenceRunner(model, len(prompt) + max_tokens, kv_dtype=kv_dtype)
    logits, out = runner.prefill(prompt), []
    for _ in range(max_tokens):
        out.append(int(np.argmax(logits)))
        if len(out) < max_tokens:
            logits = runner.decode(out[-1])
    return out


def _engine(model, **kw):
    config = EngineConfig(**{"num_blocks": 64, "max_model_len": 256, "max_num_seqs": 4, "max_batched_tokens": 48, **kw})
    return Engine(model, ByteTokenizer(), config)


def _tokens(stream):
    out = stream.collect()
    return {i: [t for o in outs for t in o.token_ids] for i, outs in out.items()}, out


def test_concurrent_greedy_requests_match_running_alone(qwen3):
    rng = np.random.default_rng(1)
    cases = [(rng.integers(3, 250, size=n).tolist(), m) for n, m in ((5, 12), (40, 7), (77, 20), (17, 9), (130, 5))]
    engine = _engine(qwen3)
    try:
        streams = [engine.submit(p, SamplingParams(max_tokens=m, **GREEDY)) for p, m in cases]
        results = [_tokens(s) for s in streams]
    finally:
        engine.close()
    for (prompt, m), (tokens, outputs) in zip(cases, results):
        assert tokens[0] == _alone(qwen3, prompt, m)
        final = outputs[0][-1]
        assert final.finish_reason == "length" and final.usage.completion_tokens == m
        assert final.usage.prompt_tokens == len(prompt) and final.usage.ttft_s <= final.usage.e2e_s
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks


def test_logprobs_n_and_seeds(qwen3):
    engine = _engine(qwen3)
    try:
        params = SamplingParams(max_tokens=6, temperature=1.0, seed=7, n=3, logprobs=3, ignore_eos=True)
        first, outputs = _tokens(engine.submit(list(range(3, 20)), params))
        again, _ = _tokens(engine.submit(list(range(3, 20)), params))
    finally:
        engine.close()
    assert sorted(first) == [0, 1, 2] and first == again  # same seed, same tokens, per choice
    assert len({tuple(v) for v in first.values()}) > 1  # choices draw differently
    for outs in outputs.values():
        logprobs = [lp for o in outs for lp in (o.logprobs or ())]
        assert len(logprobs) == 6
        for lp in logprobs:
            assert len(lp.top) == 3 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
            assert lp.logprob <= lp.top[0][1] + 1e-6


def test_stop_string_ends_the_choice(qwen3):
    engine = _engine(qwen3)
    try:
        plain, outs = _tokens(engine.submit([5, 6, 7, 8], SamplingParams(max_tokens=12, **GREEDY)))
        text = "".join(o.text for o in outs[0])
        stop = text[4:6]
        _, stopped = _tokens(engine.submit([5, 6, 7, 8], SamplingParams(max_tokens=12, stop=(stop,), **GREEDY)))
    finally:
        engine.close()
    final = stopped[0][-1]
    assert final.finish_reason == "stop" and final.stop_reason == stop
    assert "".join(o.text for o in stopped[0]) == text[: text.index(stop)]


def test_abort_frees_blocks_and_queue_limit(qwen3):
    engine = _engine(qwen3, max_queue_depth=1, max_num_seqs=1)
    try:
        stream = engine.submit(list(range(3, 60)), SamplingParams(max_tokens=150, **GREEDY))
        it = iter(stream)
        assert next(it).token_ids
        engine.submit([5, 6, 7], SamplingParams(max_tokens=2, **GREEDY), request_id="queued")
        with pytest.raises(QueueFullError):
            engine.submit([5, 6, 7], SamplingParams(max_tokens=2, **GREEDY))
        assert engine.abort(stream.request_id)
        rest = list(it)
        assert rest[-1].finish_reason == "abort" and rest[-1].usage is not None
    finally:
        engine.close()
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks


@pytest.fixture(scope="module")
def qwen3_tiled():
    """The tiny model with deterministic steps in fixed tiles (a policy with `deterministic.bucketed` off), not at
    buckets."""
    path, _ = tiny_fixture("qwen3")
    policy = get_target("cpu").policy.overridden({"deterministic.bucketed": False})
    return load_model(path, kernel_policy=policy)


@pytest.mark.parametrize("shaping", ["bucketed", "tiled"])
def test_deterministic_mode_is_batch_invariant(qwen3, qwen3_tiled, shaping):
    """Bit-identical tokens and logprobs alone and beside other requests of different lengths, with
    deterministic steps at the default buckets (the cpu target's policy) or in fixed tiles."""
    model = qwen3 if shaping == "bucketed" else qwen3_tiled
    rng = np.random.default_rng(2)
    target = (
        rng.integers(3, 250, size=37).tolist(),
        SamplingParams(max_tokens=10, temperature=0.8, seed=3, logprobs=2, ignore_eos=True),
    )
    others = [(rng.integers(3, 250, size=n).tolist(), SamplingParams(max_tokens=8, **GREEDY)) for n in (5, 70, 23)]

    def run(requests):
        engine = _engine(model, deterministic=True, max_num_seqs=8, max_batched_tokens=64)
        assert (engine.executor.tiles is None) == (shaping == "bucketed")
        try:
            streams = [engine.submit(p, s) for p, s in requests]
            outs = [s.collect()[0] for s in streams]
        finally:
            engine.close()
        return outs

    alone = run([target])[0]
    crowd = run(others[:2] + [target] + others[2:])[2]
    ids = lambda outs: [t for o in outs for t in o.token_ids]
    lps = lambda outs: [(lp.logprob, lp.top) for o in outs for lp in o.logprobs]
    assert ids(alone) == ids(crowd)
    assert lps(alone) == lps(crowd)  # exact float equality


def test_deterministic_chunked_prefill_equals_whole(qwen3):
    """A 50-token prompt prefilled in chunks of 16 or in one chunk: the same tokens and logprobs, bit for bit."""
    prompt = np.random.default_rng(5).integers(3, 250, size=50).tolist()
    params = SamplingParams(max_tokens=6, temperature=0.7, seed=11, logprobs=1, ignore_eos=True)

    def run(max_batched_tokens):
        engine = _engine(qwen3, deterministic=True, max_num_seqs=4, max_batched_tokens=max_batched_tokens)
        try:
            outs = engine.submit(prompt, params).collect()[0]
        finally:
            engine.close()
        return [t for o in outs for t in o.token_ids], [(lp.logprob, lp.top) for o in outs for lp in o.logprobs]

    assert run(16) == run(64)


def test_pool_sized_from_budget_or_context(qwen3, monkeypatch):
    from ember.runtime.engine.engine import kv_bytes_per_block, sized_config

    per_block = kv_bytes_per_block(qwen3, 16)
    d = qwen3.dims
    assert per_block == 2 * d.layers * 16 * d.hkv * d.dh * 4
    assert sized_config(qwen3, kv_memory_bytes=per_block * 10 + 5).num_blocks == 11  # + reserved block 0
    assert sized_config(qwen3, ctx=1000).num_blocks == 64
    monkeypatch.setenv("EMBER_DETERMINISTIC", "1")
    assert sized_config(qwen3, ctx=64).deterministic
    with pytest.raises(ValueError, match="holds no block"):
        sized_config(qwen3, kv_memory_bytes=per_block - 1)
