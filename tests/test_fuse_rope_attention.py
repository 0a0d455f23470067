"""compiler/passes/fuse_rope_attention.py: rope_apply + attention become one rope_attention node where the
target has a kernel for it (h200, default variant), and nowhere else; the fused plan computes what the two
ops compute (tests/test_h200_target.py runs the h200 plans, fused, against the cpu plans)."""

from __future__ import annotations

import pytest
from plan_graphs import SPECS, layer_ops, read_elsewhere

from ember.compiler.passes.fuse_rope_attention import fuse_rope_attention
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import load_spec
from ember.compiler.targets import get_target


@pytest.mark.parametrize("spec", SPECS)
def test_h200_default_plans_fuse_and_the_others_keep_bothlayer_ops(spec):
    loaded = load_spec(spec)
    fused = compile_graph(loaded, get_target("h200"))
    # the attention then learns its output projection (fuse_norm_into_projection): rope_attention_to_proj
    ops = layer_ops(fused)
    assert "rope_attention_to_proj" in ops and "rope_apply" not in ops and "attention" not in ops
    node = next(n for n in fused.region("layer").nodes if n.op == "rope_attention_to_proj")
    assert node.attr("style") in ("neox", "interleaved") and node.attr("scale") is not None
    assert node.kernel == "ember.compiler.kernels.attention.paged:rope_paged_attention_to_proj"
    for graph in (
        compile_graph(loaded, get_target("h200"), variant="deterministic"),
        compile_graph(loaded, get_target("cpu")),
    ):
        assert (
            "rope_apply" in layer_ops(graph)
            and "attention" in layer_ops(graph)
            and "rope_attention" not in layer_ops(graph)
        )


def test_a_rotated_value_read_elsewhere_is_not_fused():
    graph = compile_graph(load_spec("specs/qwen2.toml"), get_target("cpu"))
    layer = graph.region("layer")
    attention = next(n for n in layer.nodes if n.op == "attention")
    graph = read_elsewhere(graph, attention.inputs[0])
    assert "rope_attention" not in layer_ops(fuse_rope_attention(graph))
    assert "rope_attention" in layer_ops(
        fuse_rope_attention(compile_graph(load_spec("specs/qwen2.toml"), get_target("cpu")))
    )
