"""The replay drafter on an NVIDIA GPU (the h200 target's plans, tiny checkpoint): the verify steps there accept
exactly the drafts the replay meant to be right, and the output is plain greedy decoding's (what
tools/dev/bench_speculative_gpu.py relies on at real shapes).

Run on the GPU machine:
    JAX_PLATFORMS=cuda,cpu python -m pytest -q -m gpu tests/test_spec_replay_gpu.py
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda,cpu)", allow_module_level=True)

from engine_support import GREEDY, ByteTokenizer  # noqa: E402
from fixture_data import tiny_fixture  # noqa: E402

from ember.runtime.engine.engine import Engine, EngineConfig  # noqa: E402
from ember.runtime.loading.model import load_model  # noqa: E402
from ember.runtime.sampling.params import SamplingParams  # noqa: E402
from ember.runtime.speculative.config import SpeculativeConfig  # noqa: E402
from ember.tools.dev.spec_replay import ReplayDrafter, ReplayProfile  # noqa: E402

pytestmark = pytest.mark.gpu


def _run(engine, prompts, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, **GREEDY)
    streams = [engine.submit(p, params) for p in prompts]
    return [[t for o in s.collect()[0] for t in o.token_ids] for s in streams]


@pytest.mark.parametrize("adaptive", [False, True])
def test_replayed_drafts_are_verified_as_meant_on_the_gpu(adaptive):
    model = load_model(tiny_fixture("qwen3")[0], target="h200")
    rng = np.random.default_rng(6)
    prompts = [rng.integers(3, 250, size=n).tolist() for n in (7, 11, 13, 17)]
    base = {"num_blocks": 96, "max_model_len": 128, "max_num_seqs": 4, "max_batched_tokens": 64}
    plain = Engine(model, ByteTokenizer(), EngineConfig(**base))
    try:
        reference = _run(plain, prompts, 48)
    finally:
        plain.close()
    drafter = ReplayDrafter(ReplayProfile(0.8, (1.0, 1.0, 0.9, 0.8), (0.7, 0.6, 0.9, 0.5)), int(model.dims.vocab), 2)
    for p, tokens in zip(prompts, reference):
        drafter.record(p, tokens)
    spec = SpeculativeConfig("ngram", num_speculative_tokens=4, adaptive=adaptive)
    engine = Engine(model, ByteTokenizer(), EngineConfig(**base, speculative=spec), drafter=drafter)
    try:
        assert _run(engine, prompts, 48) == reference
        stats = engine.speculation_stats()
    finally:
        engine.close()
    assert stats.num_drafts > 0 and drafter.off_reference == 0
    assert stats.drafted_per_position == drafter.intended.drafted_per_position
    assert stats.accepted_per_position == drafter.intended.accepted_per_position
