"""The cpu backend's step executables kept on disk (runtime/execution/executable_cache.py step_store): a second
engine keeping executables (what `ember serve` sets) reads its ready shapes back without tracing, and both
generate the same greedy tokens (the tiny qwen3 fixture)."""

from __future__ import annotations

import jax
from engine_support import GREEDY, ByteTokenizer
from fixture_data import tiny_fixture
from jax.experimental.compilation_cache import compilation_cache

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.execution.compiled_steps import CompiledSteps
from ember.runtime.loading.model import load_model
from ember.runtime.sampling.params import SamplingParams


def test_a_cpu_engine_keeping_executables_restarts_without_tracing(tmp_path):
    model = load_model(tiny_fixture("qwen3")[0])
    config = EngineConfig(
        num_blocks=64, max_model_len=256, max_num_seqs=1, max_batched_tokens=128, keep_executables=True
    )
    # an empty JAX cache of its own: the store keeps only what XLA compiled, never what JAX's cache answered
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    compilation_cache.reset_cache()
    outputs, loaded = [], []
    try:
        for _ in range(2):
            engine = Engine(model, ByteTokenizer(), config)
            try:
                step_fn = engine.executor.step_fn
                assert isinstance(step_fn, CompiledSteps) and step_fn.store is not None
                engine.precompile(ready_only=True)
                stream = engine.submit([3, 1, 4, 1, 5, 9, 2, 6], SamplingParams(max_tokens=6, **GREEDY))
                outputs.append([t for o in stream.collect()[0] for t in o.token_ids])
                loaded.append(step_fn.loaded_from_disk)
            finally:
                engine.close()
    finally:
        jax.config.update("jax_compilation_cache_dir", previous)
        compilation_cache.reset_cache()
    assert len(list((tmp_path / "ember-executables").glob("*.exe"))) >= 2
    assert loaded[0] == 0 and loaded[1] >= 2  # the ready shapes came back from the store
    assert outputs[0] == outputs[1] and len(outputs[0]) == 6
