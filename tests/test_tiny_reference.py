"""Each spec, on a tiny random HF checkpoint, gives transformers' fp32 logits (max abs diff <= 1e-4)
for a 40-token prefill and 16 decode steps over the paged KV cache."""

import numpy as np
import pytest
from fixture_data import TINY_ARCHS, tiny_fixture

from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model

TOLERANCE = 1e-4


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_prefill_and_decode_match_transformers(arch):
    path, ref = tiny_fixture(arch)
    model = load_model(path, precision="exact")
    assert model.spec.arch == arch
    runner = SequenceRunner(model, 64)
    prefill = runner.prefill(ref["input_ids"].tolist(), all_logits=True)
    assert prefill.shape == ref["prefill_logits"].shape
    assert np.abs(prefill - ref["prefill_logits"]).max() <= TOLERANCE
    for step, (token, want) in enumerate(zip(ref["decode_ids"], ref["decode_logits"])):
        got = runner.decode(int(token))
        assert np.abs(got - want).max() <= TOLERANCE, f"decode step {step}"


def test_chunked_prefill_equals_one_shot():
    """Prefill in 16-token chunks attends to the cached blocks of earlier chunks."""
    path, ref = tiny_fixture("gemma3")  # sliding window 8 < chunk boundaries: exercises window + cache
    model = load_model(path, precision="exact")
    one = SequenceRunner(model, 64).prefill(ref["input_ids"].tolist(), all_logits=True)
    chunked = SequenceRunner(model, 64, prefill_chunk=16).prefill(ref["input_ids"].tolist(), all_logits=True)
    np.testing.assert_allclose(chunked, one, atol=1e-5)
    assert np.abs(chunked - ref["prefill_logits"]).max() <= TOLERANCE


def test_sliding_window_changes_the_result():
    """Control: the gemma3 fixture's window matters (so the test above can fail)."""

    path, ref = tiny_fixture("gemma3")
    model = load_model(path, precision="exact")
    for constants in model.params.constants:
        for name in constants:
            if name.startswith("attn_window"):
                constants[name] = np.zeros_like(constants[name])
    logits = SequenceRunner(model, 64).prefill(ref["input_ids"].tolist(), all_logits=True)
    assert np.abs(logits - ref["prefill_logits"]).max() > 1e-2
