"""A whole quantized model on the GPU: the synthetic Q4_K_M Qwen2.5-1.5B shape (the real file's tensor
types, random blocks) loaded with its GGUF weights kept packed, one decode step through the Triton
GEMV kernels against the same step through the jnp reference backend.

Skipped as a module without jax-triton or a GPU; on the H200:
    JAX_PLATFORMS=cuda python -m pytest -q -m gpu tests/test_quant_model_gpu.py
Uses the committed h200 plan when the h200 target already selects compiler/kernels/gguf_gemv/linear.py and keeps
GGUF formats; otherwise a test-local copy of the h200 target that does, compiled into a temporary folder.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

pytest.importorskip("triton")
if jax.default_backend() != "gpu":
    pytest.skip("needs an NVIDIA GPU (JAX_PLATFORMS=cuda)", allow_module_level=True)

from ember.compiler.codegen.emit import generate, write_plan  # noqa: E402
from ember.compiler.kernels.gguf_gemv import DenseBacked, QuantizedWeight, WeightGroup  # noqa: E402
from ember.compiler.kernels.triton import launch as triton_launch  # noqa: E402
from ember.compiler.passes.select_kernels import VARIANTS  # noqa: E402
from ember.compiler.pipeline import compile_graph  # noqa: E402
from ember.compiler.spec import spec_for_arch  # noqa: E402
from ember.compiler.targets import get_target  # noqa: E402
from ember.runtime.execution.sequence_runner import SequenceRunner  # noqa: E402
from ember.runtime.loading.model import load_model  # noqa: E402
from ember.runtime.loading.plans import GENERATED_DIR, load_plan  # noqa: E402
from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint  # noqa: E402

pytestmark = pytest.mark.gpu

QUANT = "ember.compiler.kernels.gguf_gemv.linear"
QUANT_KERNELS = "ember.compiler.kernels.gguf_gemv."  # the modules of the quantized GEMV kernels
# Qwen2.5-Coder-1.5B as its Q4_K_M file has it: untied head (Q6_K), Q6_K attn_v / ffn_down in 14 layers
QWEN_1_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "intermediate_size": 8960,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}


def _quant_target(tmp_path_factory):
    h200 = get_target("h200")
    if {"q4_k", "q6_k", "q8_0"} <= set(h200.policy.weights.quantized_formats) and h200.kernels["linear"].startswith(
        QUANT
    ):
        return h200, GENERATED_DIR
    local = dataclasses.replace(
        h200,
        name="h200_quant",
        policy=h200.policy.overridden({"weights.quantized_formats": ["q4_k", "q6_k", "q8_0"]}),
        kernels={
            **h200.kernels,
            "linear": f"{QUANT}:linear",
            "linear_split": f"{QUANT}:linear_split",
            "embedding": f"{QUANT}:embedding",
        },
    )
    root = tmp_path_factory.mktemp("generated")
    spec = spec_for_arch("qwen2")
    write_plan(
        {v: generate(compile_graph(spec, local, variant=v), spec, local, v) for v in VARIANTS},
        root / local.name / spec.arch,
    )
    return local, root


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    target, generated = _quant_target(tmp_path_factory)
    ckpt = synthetic_gguf_checkpoint(spec_for_arch("qwen2"), QWEN_1_5B, layer_order="lexicographic")
    return load_model(ckpt, target=target, generated_dir=generated)


def _decode_logits(model, backend: str, tokens: list[int], monkeypatch) -> tuple[np.ndarray, int]:
    """Prefill (> 16 rows: the dequantize path or the dense copies, the same for both backends), then one
    decode step.
    The model's kernel policy with that backend: the step is traced inside it (a new trace per policy)."""
    policy = model.policy.overridden({"quant_gemv.backend": backend})
    fresh = dataclasses.replace(
        model, plan=load_plan(model.spec, model.plan.target, model.generated_dir), policy=policy
    )
    launches = []
    original = triton_launch.triton_call

    def counted(*args, kernel, **kwargs):  # the quantized GEMVs' launches (not the activation quantizer's)
        if kernel.fn.__module__.startswith(QUANT_KERNELS) and kernel.fn.__name__ != "quantize_rows_kernel":
            launches.append(kernel.fn.__name__)
        return original(*args, kernel=kernel, **kwargs)

    monkeypatch.setattr(triton_launch, "triton_call", counted)
    runner = SequenceRunner(fresh, 64)
    runner.prefill(tokens[:-1])
    logits = runner.decode(tokens[-1])
    monkeypatch.setattr(triton_launch, "triton_call", original)
    return np.asarray(logits, np.float32), len(launches)


def _kept(entry: dict) -> dict:
    return {k: v.kept if isinstance(v, DenseBacked) else v for k, v in entry.items()}


def test_quantized_layout_on_the_device(model):
    if model.plan.target == "h200" and get_target("h200").policy.weights.dense_copies:
        # each projection also has its bf16 copy for steps of many rows; the gathered table has none
        assert isinstance(model.params.layers[0]["ffn_down.weight"], DenseBacked)
        assert model.params.layers[0]["ffn_down.weight"].dense.dtype == np.dtype("bfloat16")
        assert not isinstance(model.params.globals["token_embd.weight"], DenseBacked)
    layers, globals_ = [_kept(layer) for layer in model.params.layers], _kept(model.params.globals)
    assert model.dtype == np.dtype("bfloat16")
    assert isinstance(globals_["output.weight"], QuantizedWeight) and globals_["output.weight"].format == "q6_k"
    assert (
        isinstance(globals_["token_embd.weight"], QuantizedWeight) and globals_["token_embd.weight"].dtype == "bfloat16"
    )
    assert isinstance(layers[0]["attn_q+attn_k+attn_v.weight"], WeightGroup)  # Q4_K q/k + Q6_K v
    assert isinstance(layers[2]["attn_q+attn_k+attn_v.weight"], QuantizedWeight)  # all Q4_K
    weight_bytes = sum(v.nbytes for group in (globals_, *layers) for v in group.values())
    assert weight_bytes < 1.3e9  # what the GEMVs read is GGUF-sized (~1.1 GB), not the 3 GB bf16 copy


def test_triton_decode_step_matches_the_reference_backend(model, monkeypatch):
    tokens = [int(t) for t in np.random.default_rng(0).integers(100, 150000, 21)]
    reference, ref_launches = _decode_logits(model, "reference", tokens, monkeypatch)
    triton, launches = _decode_logits(model, "triton", tokens, monkeypatch)
    assert ref_launches == 0 and launches >= 28 * 4 + 1  # qkv (a group: 2-3 launches), o, gate+up, down, head
    assert np.isfinite(reference).all() and np.isfinite(triton).all()
    scale = float(np.abs(reference).max())
    assert scale > 0.1
    rel = float(np.linalg.norm(triton - reference) / np.linalg.norm(reference))
    print(
        f"decode logits: relative L2 error {rel:.2e}, max |diff| {np.abs(triton - reference).max():.3g} "
        f"of max |logit| {scale:.3g}, {launches} Triton launches"
    )
    # Calibrated on CPU with a cruder stand-in for the kernel (bf16 weights, bf16 dot): rel 3.3e-3, max
    # |diff| 0.031 of 6.06. Not argmax equality: random logits' top two are often closer than that.
    assert rel < 2e-2
    assert np.abs(triton - reference).max() <= 5e-2 * scale
    assert int(reference.argmax()) in np.argsort(triton)[-5:]
