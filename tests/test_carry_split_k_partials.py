"""carry_split_k_partials: the down projection's split-K partials go unsummed to the next layer's norm."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from plan_graphs import read_elsewhere

from ember.compiler.kernels import embedding
from ember.compiler.kernels.gguf_gemv import linear as linear_quant
from ember.compiler.kernels.gguf_gemv.layout import pack, random_gguf_bytes
from ember.compiler.kernels.norm import kernel as norm_gpu
from ember.compiler.kernels.norm import reference as norm
from ember.compiler.kernels.split_k import SplitKPartials, materialized
from ember.compiler.passes.carry_split_k_partials import carry_split_k_partials
from ember.compiler.passes.defer_residual_add import PENDING
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import SPECS_DIR, load_spec
from ember.compiler.targets import get_target
from ember.compiler.targets.policy import overriding


def _graph(arch, target, variant="default"):
    return compile_graph(load_spec(SPECS_DIR / f"{arch}.toml"), get_target(target), variant=variant)


def _marked(graph):
    return [n for r in graph.regions for n in r.nodes if n.attr("partials")]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_the_h200_down_projection_leaves_its_partials_to_the_next_norm(arch):
    graph = _graph(arch, "h200")
    layer = graph.region("layer")
    (marked,) = _marked(graph)
    assert marked.op == "gated_mlp" and marked.outputs[0] == layer.outputs[1]
    assert [n.op for n in layer.nodes if PENDING in n.inputs] == ["add_rms_norm_to_proj"]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "gemma3"])
def test_plans_without_a_summing_reader_are_unchanged(arch):
    assert _marked(_graph(arch, "cpu")) == []  # the reference add_rms_norm: nothing to gain
    assert _marked(_graph(arch, "h200", "deterministic")) == []  # no gated_linear there
    if arch == "gemma3":  # its carried value is a post-norm's output, not a projection's
        assert _marked(_graph(arch, "h200")) == []


def test_the_pass_leaves_graphs_it_does_not_match_alone():
    graph = _graph("qwen2", "h200")
    layer = graph.region("layer")
    unmarked = graph.with_region(
        replace(
            layer,
            nodes=tuple(replace(n, attrs=tuple((k, v) for k, v in n.attrs if k != "partials")) for n in layer.nodes),
        )
    )
    assert carry_split_k_partials(unmarked) == graph
    # the carried output also read inside the layer
    read = read_elsewhere(unmarked, layer.outputs[1])
    assert carry_split_k_partials(read) == read
    # the next layer reading it with the plain add_rms_norm (no kernel that sums them)
    first = next(i for i, n in enumerate(layer.nodes) if PENDING in n.inputs)
    nodes = list(unmarked.region("layer").nodes)
    nodes[first] = replace(nodes[first], op="add_rms_norm", weights=nodes[first].weights[:1])
    plain = unmarked.with_region(replace(unmarked.region("layer"), nodes=tuple(nodes)))
    assert carry_split_k_partials(plain) == plain


def test_every_reader_sums_partials_as_the_projection_would_have():
    rng = np.random.default_rng(0)
    parts = jnp.asarray(rng.standard_normal((4, 3, 64)), jnp.float32)  # 2 rows + 1 padding row
    y = SplitKPartials(parts, 2, jnp.bfloat16)
    summed = materialized(y)
    assert summed.shape == y.shape == (2, 64) and summed.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(summed, np.float32), np.asarray(jnp.sum(parts[:, :2], axis=0).astype(jnp.bfloat16), np.float32)
    )
    assert materialized(summed) is summed
    x = jnp.asarray(rng.standard_normal((2, 64)), jnp.bfloat16)
    w = jnp.ones((64,), jnp.bfloat16)
    want = norm.add_rms_norm(x, summed, w, eps=1e-6)
    for got in (norm.add_rms_norm(x, y, w, eps=1e-6), norm_gpu.add_rms_norm(x, y, w, eps=1e-6)):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    np.testing.assert_array_equal(np.asarray(embedding.add(x, y), np.float32), np.asarray(x + summed, np.float32))


@pytest.mark.parametrize("out, inner, split", [(1536, 8960, True), (1536, 1536, False)])
def test_gated_linear_returns_partials_only_when_asked_and_split(out, inner, split, kernel_overrides):
    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    w = pack(random_gguf_bytes(np.random.default_rng(0), "q4_k", (out, inner)), "q4_k", (out, inner))
    gate_up = jnp.zeros((1, 2 * inner), jnp.bfloat16)
    with overriding({"quant_gemv.backend": "triton"}):
        for partials in (False, True):
            got = jax.eval_shape(
                lambda g, w: linear_quant.gated_linear(g, w, act="silu", partials=partials), gate_up, w
            )
            if partials and split:
                assert isinstance(got, SplitKPartials) and got.rows == 1 and got.dtype == jnp.bfloat16
                assert got.parts.shape[0] > 1 and got.parts.shape[2] == out and got.parts.dtype == jnp.float32
            else:
                assert not isinstance(got, SplitKPartials) and got.shape == (1, out)
