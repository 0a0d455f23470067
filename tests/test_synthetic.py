"""Synthetic checkpoints load through the normal path at the shapes the spec gives."""

import json

import numpy as np
from fixture_data import tiny_fixture

from ember.compiler.spec import spec_for_arch
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.loading.synthetic import synthetic_checkpoint


def test_synthetic_model_matches_the_tiny_config_shapes_and_runs():
    path, _ = tiny_fixture("gemma3")
    config = json.loads((path / "config.json").read_text())
    model = load_model(synthetic_checkpoint(spec_for_arch("gemma3"), config, seed=1))
    real = load_model(path)
    for name, array in real.params.layers[0].items():
        assert model.params.layers[0][name].shape == array.shape
    logits = SequenceRunner(model, 32).prefill(list(range(3, 20)), all_logits=True)
    assert logits.shape == (17, model.dims.vocab) and np.isfinite(logits).all()
    again = load_model(synthetic_checkpoint(spec_for_arch("gemma3"), config, seed=1))
    np.testing.assert_array_equal(
        np.asarray(again.params.globals["token_embd.weight"]), np.asarray(model.params.globals["token_embd.weight"])
    )
