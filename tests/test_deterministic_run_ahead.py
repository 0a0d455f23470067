"""Deterministic decode runs ahead (several decode steps per device call, `deterministic.run_ahead`) and a row's
bits still do not depend on the load: alone, the probe's decode steps run in run-ahead calls; beside arriving
requests, in one-step calls beside prefill chunks, then in run-ahead calls of another bucket. Each step compiles
the same way in both executables (runtime/execution/engine_step.py `_step_inputs`; docs/kernel_policy.md)."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import tiny_fixture
from test_hybrid_engine import ByteTokenizer

from ember.compiler.targets import get_target
from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams

STEPS = 4  # decode steps per run-ahead call


@pytest.fixture(scope="module")
def qwen3():
    policy = get_target("cpu").policy
    assert policy.deterministic.run_ahead  # what this test proves the cpu target may say
    return load_model(tiny_fixture("qwen3")[0])


class _CountingCalls:
    """A step function that counts its calls (the executor's multi_step_fn, wrapped)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _run(model, groups):
    """Each request's (tokens, logprobs with their top alternatives), groups submitted one after another (a
    group's requests together), and how many run-ahead calls ran."""
    config = EngineConfig(
        num_blocks=96,
        block_size=4,
        max_model_len=128,
        max_num_seqs=4,
        max_batched_tokens=16,  # long prompts prefill in chunks while the probe decodes
        deterministic=True,
        decode_steps=STEPS,
        enable_prefix_caching=False,
    )
    engine = Engine(model, ByteTokenizer(), config)
    assert engine.executor.decode_steps == STEPS
    counter = engine.executor.multi_step_fn = _CountingCalls(engine.executor.multi_step_fn)
    try:
        results = []
        for group in groups:
            outs = [s.collect()[0] for s in [engine.submit(p, params) for p, params in group]]
            results += [
                ([t for o in out for t in o.token_ids], [(lp.logprob, lp.top) for o in out for lp in o.logprobs or ()])
                for out in outs
            ]
    finally:
        engine.close()
    assert engine.kv.all_free()
    return results, counter.calls


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=5)],
    ids=["greedy", "sampled"],
)
def test_deterministic_run_ahead_gives_a_row_the_same_bits_alone_and_under_arrivals(qwen3, sampling):
    rng = np.random.default_rng(4)
    probe = (rng.integers(3, 250, 21).tolist(), SamplingParams(max_tokens=20, logprobs=2, ignore_eos=True, **sampling))
    greedy = dict(temperature=0.0, ignore_eos=True)
    # arrivals with long prompts: their 16-token chunks share steps with the probe's early decode rows
    others = [
        (rng.integers(3, 250, int(n)).tolist(), SamplingParams(max_tokens=int(m), **greedy))
        for n, m in ((3, 30), (60, 9), (45, 14))
    ]
    (alone,), alone_calls = _run(qwen3, [[probe]])
    crowded, crowded_calls = _run(qwen3, [[others[0], probe, *others[1:]]])
    assert len(alone[0]) == 20 and alone_calls >= 3  # alone, its decode ran ahead
    assert crowded_calls >= 1
    assert crowded[1][0] == alone[0]
    assert crowded[1][1] == alone[1]  # exact float equality
