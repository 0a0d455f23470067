"""The engine on the real default model (CPU): concurrent requests equal running alone, and a prefix-cache
hit gives the uncached result, bit for bit in deterministic mode."""

import pytest
from fixture_data import passage_text

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.loading.text.prompting import load_tokenizer
from ember.runtime.sampling.params import SamplingParams

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def qwen(qwen_gguf):
    model = load_model(qwen_gguf)
    return model, load_tokenizer(model.checkpoint)


def _engine(model, tokenizer, **kw):
    config = dict(num_blocks=400, max_model_len=2048, max_num_seqs=16, max_batched_tokens=256, deterministic=True)
    config.update(kw)
    return Engine(model, tokenizer, EngineConfig(**config))


def _run(engine, requests):
    streams = [engine.submit(prompt, params) for prompt, params in requests]
    results = []
    for stream in streams:
        outputs = stream.collect()[0]
        results.append(
            (
                [t for o in outputs for t in o.token_ids],
                [lp.logprob for o in outputs for lp in (o.logprobs or ())],
                outputs[-1].usage,
            )
        )
    return results


def _prompts(tokenizer, lengths):
    ids = tokenizer.encode(passage_text() * 4, add_special_tokens=False)
    return [ids[i * 7 : i * 7 + n] for i, n in enumerate(lengths)]


def _check_concurrent_equals_alone(qwen, lengths, max_tokens):
    model, tokenizer = qwen
    requests = [
        (p, SamplingParams(temperature=0.0, max_tokens=m, logprobs=0, ignore_eos=True))
        for p, m in zip(_prompts(tokenizer, lengths), max_tokens)
    ]
    engine = _engine(model, tokenizer)
    try:
        together = _run(engine, requests)
        alone = [_run(engine, [r])[0] for r in requests]
    finally:
        engine.close()
    for (tokens, logprobs, _), (tokens_alone, logprobs_alone, _) in zip(together, alone):
        assert tokens == tokens_alone
        assert logprobs == logprobs_alone  # bit for bit
    assert engine.pool.free_blocks == engine.pool.num_usable_blocks


def test_four_concurrent_requests_equal_alone(qwen):
    _check_concurrent_equals_alone(qwen, [5, 61, 190, 33], [6, 4, 5, 7])


@pytest.mark.slow
def test_sixteen_concurrent_requests_5_to_900_tokens_equal_alone(qwen):
    lengths = [5, 900, 37, 410, 12, 260, 700, 88, 150, 23, 560, 71, 330, 9, 480, 120]
    _check_concurrent_equals_alone(qwen, lengths, [4 + i % 5 for i in range(16)])


def test_prefix_cache_hit_equals_uncached(qwen):
    model, tokenizer = qwen
    ids = tokenizer.encode(passage_text() * 4, add_special_tokens=False)
    # a prefix of three prefill chunks (max_batched_tokens 256), 33 full blocks of 16 shared by the second request
    prefix, first_tail, second_tail = ids[:530], ids[530:540], ids[600:608]
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=0, ignore_eos=True)
    engine = _engine(model, tokenizer)
    try:
        _run(engine, [(prefix + first_tail, params)])
        cached = _run(engine, [(prefix + second_tail, params)])[0]
    finally:
        engine.close()
    fresh_engine = _engine(model, tokenizer, enable_prefix_caching=False)
    try:
        uncached = _run(fresh_engine, [(prefix + second_tail, params)])[0]
    finally:
        fresh_engine.close()
    assert cached[2].cached_tokens >= 528
    assert uncached[2].cached_tokens == 0
    assert cached[0] == uncached[0] and cached[1] == uncached[1]
