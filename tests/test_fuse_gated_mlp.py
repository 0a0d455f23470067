"""compiler/passes/fuse_gated_mlp.py and linear_quant.gated_mlp: an MLP's gate/up projection read only by its
gated down projection becomes one gated_mlp node where the target has a kernel for it (h200, default variant),
and nowhere else; gated_mlp computes what linear then gated_linear compute, for GGUF and FP8 weights, and on
a GPU an FP8 MLP at one row is two GEMV launches (act(gate) * up made in the first one's epilogue)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from plan_graphs import SPECS, layer_ops, read_elsewhere

from ember.compiler.kernels.dense_gemv import fp8 as fp8_module
from ember.compiler.kernels.dense_gemv.fp8 import quantize_fp8
from ember.compiler.kernels.gguf_gemv import linear as linear_quant
from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
from ember.compiler.kernels.triton.launch import XLA_TRITON_TARGET
from ember.compiler.passes.fuse_gated_linear import fuse_gated_linear
from ember.compiler.passes.fuse_gated_mlp import fuse_gated_mlp
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import load_spec
from ember.compiler.targets import get_target
from ember.compiler.targets.policy import overriding


@pytest.mark.parametrize("spec", SPECS)
def test_h200_default_plans_fuse_and_the_others_do_not(spec):
    loaded = load_spec(spec)
    fused = compile_graph(loaded, get_target("h200"))
    assert "gated_mlp" in layer_ops(fused) and "gated_linear" not in layer_ops(fused)
    node = next(n for n in fused.region("layer").nodes if n.op == "gated_mlp")
    assert node.weight("gate_up").startswith("ffn_gate") and node.weight("down").startswith("ffn_down")
    assert (
        node.attr("act") in ("silu", "gelu_tanh") and node.kernel == "ember.compiler.kernels.gguf_gemv.linear:gated_mlp"
    )
    # carry_split_k_partials' mark on the gated_linear carried over (gemma3's post-norms: no carried partials)
    assert node.attr("partials", False) is (not spec.endswith("gemma3.toml"))
    for graph in (
        compile_graph(loaded, get_target("h200"), variant="deterministic"),
        compile_graph(loaded, get_target("cpu")),
    ):
        assert "gated_mlp" not in layer_ops(graph)


def test_a_gate_up_output_read_elsewhere_is_not_fused():
    graph = fuse_gated_linear(compile_graph(load_spec("specs/qwen2.toml"), get_target("cpu")))
    layer = graph.region("layer")
    assert "gated_mlp" in layer_ops(fuse_gated_mlp(graph))
    gated = next(n for n in layer.nodes if n.op == "gated_linear")
    graph = read_elsewhere(graph, gated.inputs[0])
    assert "gated_mlp" not in layer_ops(fuse_gated_mlp(graph))


@pytest.mark.parametrize("kind", ["q4_k", "fp8"])
@pytest.mark.parametrize("rows", [1, 9])
def test_gated_mlp_equals_the_projection_then_the_gated_projection(kind, rows):
    rng = np.random.default_rng(rows)
    if kind == "q4_k":
        gate_up = pack(random_gguf_bytes(rng, "q4_k", (512, 256), realistic=True), "q4_k", (512, 256))
        down = pack(random_gguf_bytes(rng, "q4_k", (64, 256), realistic=True), "q4_k", (64, 256))
    else:
        gate_up = quantize_fp8(rng.standard_normal((512, 256)).astype(np.float32) * 0.1)
        down = quantize_fp8(rng.standard_normal((64, 256)).astype(np.float32) * 0.1)
    x = jnp.asarray(rng.standard_normal((rows, 256)), jnp.bfloat16)
    with overriding({"quant_gemv.backend": "reference"}):
        got = jax.jit(lambda x: linear_quant.gated_mlp(x, gate_up, down, act="silu"))(x)
        want = jax.jit(lambda x: linear_quant.gated_linear(linear_quant.linear(x, gate_up), down, act="silu"))(x)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_an_fp8_mlp_at_one_row_is_two_gemv_launches_on_a_gpu(monkeypatch):
    monkeypatch.setattr(fp8_module, "triton_available", lambda: True)  # as if traced for a GPU
    gate_up = quantize_fp8(jnp.zeros((2 * 14336, 4096), jnp.float32))
    down = quantize_fp8(jnp.zeros((4096, 14336), jnp.float32))
    x = jnp.zeros((1, 4096), jnp.bfloat16)
    text = (
        jax.jit(lambda x: linear_quant.gated_mlp(x, gate_up, down, act="silu"))
        .trace(x)
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    assert text.count(XLA_TRITON_TARGET) == 2 and "multiply" not in text and "slice" not in text
