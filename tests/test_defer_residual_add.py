"""defer_residual_add: a layer's closing residual add becomes the next layer's (or the epilogue's) first add."""

from dataclasses import replace

import jax.numpy as jnp
import numpy as np
import pytest

from ember.compiler.frontend import lower
from ember.compiler.ir import Node
from ember.compiler.kernels import embedding
from ember.compiler.kernels.norm import kernel as norm_gpu
from ember.compiler.kernels.norm import quant_kernel as norm_quant_gpu
from ember.compiler.kernels.norm import reference as norm
from ember.compiler.passes.defer_residual_add import PENDING, SUM, defer_residual_add
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import SPECS_DIR, known_archs, load_spec
from ember.compiler.targets import get_target


@pytest.mark.parametrize("arch", known_archs())
@pytest.mark.parametrize("target", ["cpu", "h200"])
def test_every_spec_hands_the_residual_add_to_the_next_norm(arch, target):
    graph = compile_graph(load_spec(SPECS_DIR / f"{arch}.toml"), get_target(target))
    epilogue = graph.region("epilogue")
    assert PENDING in epilogue.inputs
    for layer in graph.layer_regions():  # every layer body (one per kind combination) hands the add on
        assert PENDING in layer.inputs
        assert len(layer.outputs) == 2  # the add's two operands, no add left at the layer's end
        producers = {out: n for n in layer.nodes for out in n.outputs}
        # no residual add left at the end (an add of two branch values, e.g. routed + shared experts, may stay)
        stream = {SUM} | {n.outputs[0] for n in layer.nodes if n.op.startswith("add_rms_norm")}
        assert all(producers[out].op != "add" or not stream & set(producers[out].inputs) for out in layer.outputs)
        first = next(n for n in layer.nodes if "x" in n.inputs)
        assert first.op.startswith("add_rms_norm") and first.inputs[:2] == ("x", PENDING) and first.outputs[0] == SUM
        assert all("x" not in n.inputs for n in layer.nodes if n is not first)  # later readers take the sum
    assert epilogue.nodes[0].op == "add" and epilogue.nodes[0].inputs == ("x", PENDING)
    assert all("x" not in n.inputs for n in epilogue.nodes[1:])


def test_graphs_without_the_pattern_are_left_alone():
    graph = lower(load_spec(SPECS_DIR / "qwen2.toml"))  # before any pass: x alone carried
    layer = graph.region("layer")
    assert defer_residual_add(graph) != graph
    # the block's output a norm of the sum rather than the sum
    closing = Node("rms_norm", layer.outputs, ("closed",), (("weight", "attn_norm.weight"),), (("eps", 1e-6),))
    closed = graph.with_region(replace(layer, nodes=layer.nodes + (closing,), outputs=("closed",)))
    assert defer_residual_add(closed) == closed
    # the layer's first reader of x not a norm (a post-norm block: x goes straight into a projection)
    first = next(i for i, n in enumerate(layer.nodes) if "x" in n.inputs)
    probe = Node("add", ("x", "x"), ("probe",))
    opened = graph.with_region(replace(layer, nodes=layer.nodes[:first] + (probe,) + layer.nodes[first:]))
    assert defer_residual_add(opened) == opened


def test_nothing_pending_before_the_first_layer_passes_x_through():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.bfloat16)
    w = jnp.asarray(rng.uniform(0.5, 1.5, 64), jnp.bfloat16)
    want = norm.rms_norm(x, w, eps=1e-6)
    assert embedding.add(x, None) is x
    for s, h in (
        norm.add_rms_norm(x, None, w, eps=1e-6),
        norm_gpu.add_rms_norm(x, None, w, eps=1e-6),
        norm_quant_gpu.add_rms_norm_to_proj(x, None, w, None, eps=1e-6),
    ):
        assert s is x
        np.testing.assert_array_equal(np.asarray(h, np.float32), np.asarray(want, np.float32))
