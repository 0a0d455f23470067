"""The h200 target's plans (bf16 activations and weights) compute what the cpu target's fp32 plans
compute, to bf16 accuracy: run here on CPU through XLA, teacher-forced on each tiny checkpoint."""

import numpy as np
import pytest
from fixture_data import TINY_ARCHS, tiny_fixture

from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_h200_plan_agrees_with_the_cpu_plan(arch):
    path, ref = tiny_fixture(arch)
    tokens = ref["input_ids"].tolist()
    exact = SequenceRunner(load_model(path, target="cpu"), 64).prefill(tokens, all_logits=True)
    model = load_model(path, target="h200")
    assert model.plan.manifest["activation_dtype"] == "bfloat16"
    fast = SequenceRunner(model, 64).prefill(tokens, all_logits=True).astype(np.float32)
    p_exact, p_fast = _log_softmax(exact), _log_softmax(fast)
    kl = (np.exp(p_exact) * (p_exact - p_fast)).sum(-1)
    assert (exact.argmax(-1) == fast.argmax(-1)).mean() >= 0.9
    assert kl.mean() <= 1e-2, kl.mean()


def test_layer_constants_keep_full_precision_in_bf16_plans():
    """RoPE inverse frequencies stay float32 and windows / state indices int32 on a bf16 target: in bf16 an
    inverse frequency is off by up to 2^-9 (radians of error by position ~1000) and a window of 1000 by 4."""
    path, _ = tiny_fixture("gemma3")
    model = load_model(path, target="h200")
    for constants in model.params.constants:
        assert constants["rope_inv_freq0"].dtype == np.float32
        assert constants["attn_window1"].dtype == np.int32 and constants["attn_state2"].dtype == np.int32
    windows = {int(c["attn_window1"]) for c in model.params.constants}
    assert windows == {0, int(model.dims.window)}
