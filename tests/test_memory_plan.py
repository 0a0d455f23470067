"""The weights' device bytes worked out before loading (runtime/loading/memory_plan.py) equal what the load then
places, for every way a weight is kept; and a model that does not fit a (small, artificial) memory limit fails
before any tensor is read, with both figures in the message."""

from __future__ import annotations

import pytest
from fixture_data import tiny_fixture
from test_weight_bytes import CONFIG, GGUF_FORMATS

from ember.compiler.spec import spec_for_arch
from ember.compiler.targets import get_target
from ember.runtime.loading import model as model_module
from ember.runtime.loading.memory_plan import (
    InsufficientMemoryError,
    free_device_bytes,
    keeps_dense_copies,
    planned_weight_bytes,
)
from ember.runtime.loading.model import load_model
from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint
from ember.runtime.loading.weight_bytes import device_weight_bytes

POLICIES = {
    "dequantized": {"weights.quantized_formats": []},
    "int8_blocks": {"weights.kept_layout": "int8_blocks"},
    "nibble_blocks": {"weights.kept_layout": "nibble_blocks"},
    "kept": {"weights.quantized_formats": GGUF_FORMATS, "weights.kept_layout": "planes"},
    "kept+copies": {
        "weights.quantized_formats": GGUF_FORMATS,
        "weights.kept_layout": "planes",
        "weights.dense_copies": True,
    },
}


def _planned(model) -> int:
    w = model.policy.weights
    return planned_weight_bytes(
        model.spec,
        model.plan.manifest,
        model.checkpoint,
        model.resolved,
        model.dtype,
        w.quantized_formats,
        w.dense_copies,
        kept_layout=w.kept_layout,
    )


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_plan_equals_the_loaded_bytes_for_gguf(policy, tied):
    ckpt = synthetic_gguf_checkpoint(spec_for_arch("llama"), {**CONFIG, "tie_word_embeddings": tied}, seed=2)
    model = load_model(ckpt, target="cpu", kernel_policy=get_target("cpu").policy.overridden(POLICIES[policy]))
    assert _planned(model) == device_weight_bytes(model.params)


def test_plan_equals_the_loaded_bytes_for_hf_floats():
    model = load_model(tiny_fixture("llama")[0], target="cpu")
    assert _planned(model) == device_weight_bytes(model.params)


def test_a_model_over_the_limit_fails_before_reading_a_tensor(monkeypatch):
    ckpt = synthetic_gguf_checkpoint(spec_for_arch("llama"), CONFIG, seed=2)
    monkeypatch.setattr(model_module, "load_params", lambda *a, **k: pytest.fail("weights were loaded"))
    with pytest.raises(InsufficientMemoryError, match=r"need 0\.0\d GB on the device but only 0\.00 GB is free"):
        load_model(ckpt, target="cpu", free_bytes=1_000_000)


def test_the_host_cpu_reports_no_device_limit():
    # the host's memory is shared with every process: only an explicit free_bytes is checked there
    assert free_device_bytes() is None


def test_dense_copies_are_left_out_where_they_would_crowd_the_device(capfd):
    # the h200 target's rule on the cpu target's plans: kept GGUF blocks with a dense copy beside each
    ckpt = synthetic_gguf_checkpoint(spec_for_arch("llama"), CONFIG, seed=2)
    policy = get_target("cpu").policy.overridden(POLICIES["kept+copies"])
    roomy = load_model(ckpt, target="cpu", kernel_policy=policy, free_bytes=10**12)
    with_copies = device_weight_bytes(roomy.params)
    without = planned_weight_bytes(
        roomy.spec, roomy.plan.manifest, ckpt, roomy.resolved, roomy.dtype, GGUF_FORMATS, False, kept_layout="planes"
    )
    assert roomy.policy.weights.dense_copies and without < with_copies / 2
    capfd.readouterr()
    # with copies the weights would take all of the free memory, over the default share of half
    tight = load_model(ckpt, target="cpu", kernel_policy=policy, free_bytes=with_copies)
    assert not tight.policy.weights.dense_copies
    assert device_weight_bytes(tight.params) == without == _planned(tight)
    assert "no dense copies of the quantized weights" in capfd.readouterr().err
    # the share is the policy's: at 1.0 the same memory keeps them
    whole = policy.overridden({"weights.dense_copies_max_share": 1.0})
    kept = load_model(ckpt, target="cpu", kernel_policy=whole, free_bytes=with_copies)
    assert kept.policy.weights.dense_copies and device_weight_bytes(kept.params) == with_copies


def test_the_copy_share_must_be_a_share():
    with pytest.raises(ValueError, match=r"dense_copies_max_share must be in \(0, 1\]"):
        get_target("cpu").policy.overridden({"weights.dense_copies_max_share": 1.5})
    with pytest.raises(ValueError, match="must be float"):
        get_target("cpu").policy.overridden({"weights.dense_copies_max_share": "half"})


def _h200_planned(shape: str):
    """(copies -> the weights' device bytes on the h200 target, the checkpoint) for a synthetic shape's Q4_K_M
    layout, planned lazily: no tensor is drawn."""
    from ember.runtime.loading.model import GENERATED_DIR, load_plan, resolve
    from ember.tools.bench_models import SYNTHETIC_SHAPES

    arch, config = SYNTHETIC_SHAPES[shape]
    spec = spec_for_arch(arch)
    ckpt = synthetic_gguf_checkpoint(spec, config, scheme="q4_k_m", seed=0)
    resolved, manifest = resolve(spec, ckpt), load_plan(spec, "h200", GENERATED_DIR).manifest
    w = get_target("h200").policy.weights
    return (
        lambda copies: planned_weight_bytes(
            spec, manifest, ckpt, resolved, "bfloat16", w.quantized_formats, copies, kept_layout=w.kept_layout
        ),
        ckpt,
    )


def test_a_70b_q4_k_m_loads_on_one_h200_without_copies():
    weights, h200_free = get_target("h200").policy.weights, 139 * 10**9
    planned, ckpt = _h200_planned("llama3-70b")  # with bf16 copies ~181 GB
    assert planned(True) > h200_free
    assert keeps_dense_copies(planned, weights, h200_free) == (False, planned(False))
    assert planned(False) <= 1.05 * ckpt.tensor_bytes()
    planned, _ = _h200_planned("llama3-8b")  # its copies fit within the share and stay
    assert keeps_dense_copies(planned, weights, h200_free) == (True, planned(True))
