"""The engine streams a device call's tokens while the next call runs (runtime/engine/loop.py `_loop`): outputs are
exactly those of streaming each call before the next one — text, ids, logprobs, finish reasons and usage —
for requests that stop on strings, stop ids and max_tokens inside a call, n > 1, min_tokens and grammar
rows (which are streamed at once), and every KV block comes back."""

import numpy as np
import pytest
from fixture_data import tiny_fixture
from test_engine import ByteTokenizer

import ember.runtime.engine.loop as engine_module
from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams


@pytest.fixture(scope="module")
def qwen3():
    path, _ = tiny_fixture("qwen3")
    return load_model(path)


def _cases():
    rng = np.random.default_rng(11)
    prompts = [rng.integers(8, 250, size=n).tolist() for n in (6, 30, 14, 51, 9, 22)]
    greedy = dict(temperature=0.0, ignore_eos=True)
    return [
        (prompts[0], SamplingParams(max_tokens=21, logprobs=2, **greedy)),
        (prompts[1], SamplingParams(max_tokens=30, stop=("AB", "C", "DE", "F", "G", "H"), **greedy)),  # a stop string
        (prompts[2], SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=17, ignore_eos=True)),
        (prompts[3], SamplingParams(max_tokens=25, min_tokens=12, stop_token_ids=list(range(0, 256, 16)), **greedy)),
        (prompts[4], SamplingParams(max_tokens=19, stop_token_ids=[100, 101, 102, 103], **greedy)),
        (prompts[5], SamplingParams(max_tokens=13, **greedy)),
    ]


def _run(model, defer: bool, monkeypatch):
    if not defer:
        monkeypatch.setattr(engine_module, "row_can_defer", lambda row: False)
    config = EngineConfig(num_blocks=96, max_model_len=256, max_num_seqs=8, max_batched_tokens=64, decode_steps=4)
    engine = Engine(model, ByteTokenizer(), config)
    try:
        streams = [engine.submit(prompt, params) for prompt, params in _cases()]
        outputs = [stream.collect() for stream in streams]
        snapshot = engine.snapshot()
    finally:
        engine.close()
        monkeypatch.undo()
    return outputs, snapshot


def _summary(outputs):
    """Per request, per choice: (text, ids, logprob pairs, finish, stop reason); and the usage."""
    result = []
    for by_choice in outputs:
        choices = {}
        usage = None
        for index, outs in by_choice.items():
            logprobs = [(lp.token_id, round(lp.logprob, 5)) for o in outs for lp in (o.logprobs or ())]
            choices[index] = (
                "".join(o.text for o in outs),
                [t for o in outs for t in o.token_ids],
                logprobs,
                outs[-1].finish_reason,
                outs[-1].stop_reason,
            )
            usage = next((o.usage for o in outs if o.usage is not None), usage)
        result.append((choices, usage.prompt_tokens, usage.completion_tokens))
    return result


def test_streaming_while_the_next_call_runs_changes_no_output(qwen3, monkeypatch):
    deferred, snapshot = _run(qwen3, True, monkeypatch)
    at_once, _ = _run(qwen3, False, monkeypatch)
    assert _summary(deferred) == _summary(at_once)
    ends = [(choice[3], choice[4]) for request, _, _ in _summary(deferred) for choice in request.values()]
    assert {"length"} < {reason for reason, _ in ends}
    assert any(isinstance(stop, str) for _, stop in ends) and any(isinstance(stop, int) for _, stop in ends)
    assert snapshot["free_kv_blocks"] == snapshot["total_kv_blocks"]  # nothing leaked
    assert snapshot["running"] == 0


def test_a_call_streams_as_one_output_per_choice(qwen3, monkeypatch):
    outputs, _ = _run(qwen3, True, monkeypatch)
    first = outputs[0][0]  # greedy, max_tokens 21, 4 decode steps per call: some outputs carry several tokens
    assert sum(len(o.token_ids) for o in first) == 21
    assert max(len(o.token_ids) for o in first) > 1
    assert all(len(o.logprobs) == len(o.token_ids) for o in first if o.token_ids)


def test_deterministic_steps_run_ahead_only_where_the_policy_says_so(qwen3):
    """Whether a call runs ahead depends on the load, so a deterministic engine runs ahead only where its target's
    kernel policy says each step compiles the same way inside a run-ahead call (`deterministic.run_ahead`, true on
    the cpu target: tests/test_deterministic_run_ahead.py); otherwise one decode step per call whatever
    decode_steps says (docs/kernel_policy.md, "Batch invariance")."""
    from ember.compiler.targets import get_target

    settings = dict(num_blocks=96, max_model_len=256, max_num_seqs=8, max_batched_tokens=64, decode_steps=4)
    no_run_ahead = get_target("cpu").policy.overridden({"deterministic.run_ahead": False})
    held = load_model(tiny_fixture("qwen3")[0], kernel_policy=no_run_ahead)
    engines = [
        Engine(model, ByteTokenizer(), EngineConfig(deterministic=deterministic, **settings))
        for model, deterministic in ((qwen3, False), (qwen3, True), (held, True))
    ]
    try:
        assert [e.executor.decode_steps for e in engines] == [4, 4, 1]
        assert [e.executor.multi_step_fn is None for e in engines] == [False, False, True]
    finally:
        for engine in engines:
            engine.close()
