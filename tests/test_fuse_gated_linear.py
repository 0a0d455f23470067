"""compiler/passes/fuse_gated_linear.py and linear_quant.gated_linear: a gated activation read only by an
unbiased projection becomes one gated_linear node where the target has a kernel for it (h200, default
variant), and nowhere else; gated_linear computes what the two ops compute, and on a GPU its decode GEMV on
int8 activations makes the activation inside the quantizer (no kernel of its own)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from plan_graphs import SPECS, layer_ops, read_elsewhere

from ember.compiler.kernels import activation
from ember.compiler.kernels.gguf_gemv import DenseBacked, dequantize, pack, random_gguf_bytes
from ember.compiler.kernels.gguf_gemv import linear as linear_quant
from ember.compiler.passes.fuse_gated_linear import fuse_gated_linear
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import load_spec
from ember.compiler.targets import get_target
from ember.compiler.targets.policy import overriding


@pytest.mark.parametrize("spec", SPECS)
def test_h200_default_plans_fuse_and_the_others_keep_bothlayer_ops(spec):
    loaded = load_spec(spec)
    fused = fuse_gated_linear(compile_graph(loaded, get_target("cpu")))  # the pass alone, on the cpu graph
    assert "gated_linear" in layer_ops(fused) and "gated_act_packed" not in layer_ops(fused)
    node = next(n for n in fused.region("layer").nodes if n.op == "gated_linear")
    assert node.attr("act") in ("silu", "gelu_tanh") and node.weight("weight").startswith("ffn_down")
    h200 = compile_graph(loaded, get_target("h200"))  # there fuse_gated_mlp takes the gated_linear on
    assert "gated_act_packed" not in layer_ops(h200) and "gated_mlp" in layer_ops(h200)
    for graph in (
        compile_graph(loaded, get_target("h200"), variant="deterministic"),
        compile_graph(loaded, get_target("cpu")),
    ):
        assert "gated_act_packed" in layer_ops(graph) and "gated_linear" not in layer_ops(graph)


def test_an_activation_read_elsewhere_is_not_fused():
    graph = compile_graph(load_spec("specs/qwen2.toml"), get_target("cpu"))
    layer = graph.region("layer")
    act = next(n for n in layer.nodes if n.op == "gated_act_packed")
    assert "gated_linear" in layer_ops(fuse_gated_linear(graph))
    graph = read_elsewhere(graph, act.outputs[0])
    assert "gated_linear" not in layer_ops(fuse_gated_linear(graph))


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows", [1, 9])
def test_gated_linear_equals_the_activation_then_the_projection(act, rows):
    rng = np.random.default_rng(rows)
    w = pack(random_gguf_bytes(rng, "q4_k", (48, 512), realistic=True), "q4_k", (48, 512))
    gate_up = jnp.asarray(rng.standard_normal((rows, 1024)), jnp.float32)
    hidden = activation.gated_act_packed(gate_up, act=act)
    with overriding({"quant_gemv.backend": "reference"}):
        for weight in (w, np.asarray(dequantize(w)), DenseBacked(w, np.asarray(dequantize(w)))):
            got = jax.jit(lambda g, w: linear_quant.gated_linear(g, w, act=act))(gate_up, weight)
            want = jax.jit(linear_quant.linear)(hidden, weight)
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)  # fp32 order


def test_silu_gated_decode_lowers_to_the_quantizer_and_the_gemv_alone(kernel_overrides):
    """1.5B down projection at batch 1: the gate/up output goes straight into the quantizer (SILU_GATED), no
    XLA kernel computes the activation (no logistic), then the dp4a GEMV and its split-K sum."""
    from ember.compiler.kernels.triton.launch import XLA_TRITON_TARGET

    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    w = pack(random_gguf_bytes(np.random.default_rng(0), "q4_k", (1536, 8960)), "q4_k", (1536, 8960))
    with overriding({"quant_gemv.backend": "triton"}):
        text = (
            jax.jit(lambda g, w: linear_quant.gated_linear(g, w, act="silu"))
            .trace(jnp.zeros((1, 2 * 8960), jnp.bfloat16), w)
            .lower(lowering_platforms=("cuda",))
            .as_text()
        )
    calls = [line for line in text.splitlines() if XLA_TRITON_TARGET in line]
    assert len(calls) == 2 and "quantize_rows_kernel" in calls[0] and "dp4a_gemv_kernel" in calls[1]
    assert "stablehlo.logistic" not in text and "stablehlo.multiply" not in text
