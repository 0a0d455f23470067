"""A K-quant MoE GGUF on the h200 target keeps its expert stacks packed (WeightPolicy.packed_experts, opt-in): the
Q4_K gate / up and Q6_K down stacks of the qwen3_moe K-quant fixture are placed as compiler/kernels/moe/packed.py
lays them out, in the file's bytes with no dense copy, the memory plan counts those bytes, and the plan run on
this machine (the reference path: the stacks dequantized in the step) gives exactly the logits of the same
plan with the stacks dequantized at load."""

import gguf
import numpy as np
from fixture_data import kquant_fixture

from ember.compiler.kernels.gguf_gemv.layout import DenseBacked
from ember.compiler.kernels.moe.packed import is_packed_experts
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.memory_plan import planned_weight_bytes
from ember.runtime.loading.model import effective_policy, load_model

STACKS = {"ffn_gate_exps.weight": "q4_k", "ffn_up_exps.weight": "q4_k", "ffn_down_exps.weight": "q6_k"}


def _prefill_logits(model, prompt):
    return np.asarray(SequenceRunner(model, 64).prefill(prompt, all_logits=True), np.float32)


def test_the_h200_target_keeps_expert_stacks_packed_and_runs_them():
    path, ref, config, _ = kquant_fixture()
    stored = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    policy = effective_policy("h200").overridden({"weights.packed_experts": ["q4_k", "q6_k", "q8_0", "q5_0"]})
    packed = load_model(path, target="h200", kernel_policy=policy)
    experts, hidden, n_ff = config["num_local_experts"], config["hidden_size"], config["moe_intermediate_size"]
    saved = 0
    for i, layer in enumerate(packed.params.layers):
        for name, fmt in STACKS.items():
            stack = layer[name]
            assert is_packed_experts(stack) and not isinstance(stack, DenseBacked), (i, name, type(stack))
            assert stack.format == fmt
            assert stack.shape == ((experts, hidden, n_ff) if "down" in name else (experts, n_ff, hidden))
            assert stack.nbytes == stored[f"blk.{i}.{name}"]  # the file's bytes, nothing beside them
            saved += int(np.prod(stack.shape)) * 2 - stack.nbytes  # against a bf16 stack
    assert packed.policy.weights.packed_experts == policy.weights.packed_experts

    unpacked_policy = policy.overridden({"weights.packed_experts": []})
    unpacked = load_model(path, target="h200", kernel_policy=unpacked_policy)
    assert all(not is_packed_experts(layer[name]) for layer in unpacked.params.layers for name in STACKS)
    plan_bytes = [
        planned_weight_bytes(
            m.spec,
            m.plan.manifest,
            m.checkpoint,
            m.resolved,
            m.dtype,
            w.quantized_formats,
            w.dense_copies,
            keep_experts=w.packed_experts,
        )
        for m, w in ((unpacked, unpacked_policy.weights), (packed, policy.weights))
    ]
    assert plan_bytes[0] - plan_bytes[1] == saved > 0

    prompt = [int(t) for t in ref["input_ids"][:24]]
    got, want = _prefill_logits(packed, prompt), _prefill_logits(unpacked, prompt)
    np.testing.assert_array_equal(got, want)  # dequantized in the step or at load: the same bf16 values
    exact = ref["prefill_logits"][: len(prompt)]  # transformers, fp32, on the file's dequantized weights
    assert np.abs(got - exact).mean() <= 0.02 * exact.std()


def test_packed_experts_are_an_opt_in():
    assert effective_policy("cpu").weights.packed_experts == ()
    assert effective_policy("h200").weights.packed_experts == ()  # until the GPU test and bench have run
    assert effective_policy("h200", precision="exact").weights.packed_experts == ()
