"""compiler/passes/fuse_norm_into_gemv.py and compiler/ops/norm_gemv.py: a residual add + RMSNorm read by one
packed q/k/v projection or gated MLP becomes one op (h200, default variant; nowhere else). Traced for a GPU
with FP8 weights at one row it is one launch (quant/fp8_norm_gemv.py: the norm in a persistent GEMV's
prologue); everywhere else it runs the norm then the projection, the values the two ops make."""

from __future__ import annotations

import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from plan_graphs import SPECS, layer_ops

from ember.compiler.ir import Node
from ember.compiler.ops import linear_quant, norm, norm_gemv, norm_gpu
from ember.compiler.ops.quant import fp8 as fp8_module
from ember.compiler.ops.quant.fp8 import quantize_fp8
from ember.compiler.ops.quant.fp8_norm_gemv import Fp8NormGemvConfig, fits, launch_plan
from ember.compiler.ops.split_k import SplitKPartials
from ember.compiler.passes.fuse_norm_into_gemv import fuse_norm_into_gemv
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import load_spec
from ember.compiler.targets import get_target
from ember.compiler.ops.triton_launch import XLA_TRITON_TARGET


def _defined_before_use(region) -> bool:
    defined = set(region.inputs)
    for node in region.nodes:
        if not set(node.inputs) <= defined:
            return False
        defined.update(node.outputs)
    return True


@pytest.mark.parametrize("spec", SPECS)
def test_h200_default_plans_fold_both_layer_norms_into_their_projections(spec):
    loaded = load_spec(spec)
    graph = compile_graph(loaded, get_target("h200"))
    layer = graph.region("layer")
    ops = layer_ops(graph)
    if not spec.endswith("gemma3.toml"):  # gemma3's post-norms read no projection: its first norm only
        assert "add_rms_norm_to_proj" not in ops and "gated_mlp" not in ops and "linear_split" not in ops
    fused = next(n for n in layer.nodes if n.op == "add_rms_norm_linear_split")
    assert fused.weight("weight") == "attn_norm.weight" and fused.weight("proj").startswith("attn_q")
    assert (fused.weight("bias") is not None) == spec.endswith("qwen2.toml")  # the bias rides along
    assert fused.kernel == "ember.compiler.ops.norm_gemv:add_rms_norm_linear_split" and len(fused.outputs) == 4
    assert _defined_before_use(layer)
    for other in (compile_graph(loaded, get_target("h200"), variant="deterministic"),
                  compile_graph(loaded, get_target("cpu"))):
        assert not {"add_rms_norm_linear_split", "add_rms_norm_gated_mlp"} & set(layer_ops(other))


def test_the_mlp_norm_and_the_gated_mlp_become_one_node_that_keeps_the_partials_mark():
    layer = compile_graph(load_spec("specs/llama.toml"), get_target("h200")).region("layer")
    (mlp,) = [n for n in layer.nodes if n.op == "add_rms_norm_gated_mlp"]
    assert [p for p, _ in mlp.weights] == ["weight", "gate_up", "down"]
    assert mlp.attr("act") == "silu" and mlp.attr("partials") is True and mlp.outputs[1] == layer.outputs[1]


def test_a_normed_row_read_elsewhere_is_not_fused():
    graph = compile_graph(load_spec("specs/llama.toml"), get_target("h200"))
    unfused = fuse_norm_into_gemv(graph, frozenset())  # no fused op available: unchanged
    assert unfused == graph
    layer = compile_graph(load_spec("specs/llama.toml"), get_target("cpu")).region("layer")
    norm_node = Node("add_rms_norm_to_proj", ("x", "y"), ("s", "h"), (("weight", "w"), ("reader", "W")))
    proj = Node("linear_split", ("h",), ("q", "k", "v"), (("weight", "W"),), (("sizes", (1, 1, 1)),))
    spy = Node("add", ("h", "h"), ("spy",))
    for nodes, folded in (((norm_node, proj), True), ((norm_node, proj, spy), False)):
        region = replace(layer, inputs=("x", "y"), nodes=nodes, outputs=("s",) + (("spy",) if spy in nodes else ()))
        out = fuse_norm_into_gemv(graph.with_region(region)).region("layer")
        assert ("add_rms_norm_linear_split" in [n.op for n in out.nodes]) is folded


def _inputs(rows=1, d=64, add=True, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((rows, d)) * 3, jnp.bfloat16)
    y = jnp.asarray(rng.standard_normal((rows, d)), jnp.bfloat16) if add else None
    w = jnp.asarray(rng.uniform(0.5, 1.5, d), jnp.bfloat16)
    return x, y, w


@pytest.mark.parametrize("add", [True, False])
def test_on_this_cpu_the_ops_are_the_norm_then_the_projection(add):
    x, y, w = _inputs(rows=2, add=add)
    qkv = quantize_fp8(np.random.default_rng(1).standard_normal((96, 64)).astype(np.float32))
    got = norm_gemv.add_rms_norm_linear_split(x, y, w, qkv, sizes=(64, 16, 16), eps=1e-6)
    s, h = (x, norm.rms_norm(x, w, eps=1e-6)) if y is None else norm.add_rms_norm(x, y, w, eps=1e-6)
    want = (s, *linear_quant.linear_split(h, qkv, sizes=(64, 16, 16)))
    assert len(got) == 4
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    gate_up, down = (quantize_fp8(np.random.default_rng(k).standard_normal(shape).astype(np.float32))
                     for k, shape in ((2, (64, 64)), (3, (64, 32))))
    got = norm_gemv.add_rms_norm_gated_mlp(x, y, w, gate_up, down, act="silu", eps=1e-6)
    want = (s, linear_quant.gated_mlp(h, gate_up, down, act="silu"))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_split_k_partials_are_summed_by_the_norm_as_before():
    x, _, w = _inputs(rows=2)
    parts = jnp.asarray(np.random.default_rng(4).standard_normal((3, 2, 64)), jnp.float32)
    y = SplitKPartials(parts, 2, jnp.bfloat16)
    qkv = quantize_fp8(np.ones((96, 64), np.float32))
    got = norm_gemv.add_rms_norm_linear_split(x, y, w, qkv, sizes=(64, 16, 16), eps=1e-6)
    s, _ = norm.add_rms_norm(x, jnp.sum(parts, 0).astype(jnp.bfloat16), w, eps=1e-6)
    np.testing.assert_array_equal(np.asarray(got[0], np.float32), np.asarray(s, np.float32))


def test_fits_only_one_bf16_row_of_a_per_channel_fp8_weight():
    w = quantize_fp8(np.zeros((6144, 4096), np.float32))
    row = jnp.zeros((1, 4096), jnp.bfloat16)
    assert fits(row, w, "parts", (4096, 1024, 1024)) and fits(row, w, "gate_up") and fits(row, w, "plain")
    assert not fits(jnp.zeros((2, 4096), jnp.bfloat16), w, "plain")  # one decode row
    assert not fits(row.astype(jnp.float32), w, "plain")  # bf16 activations (the word loop's quads)
    assert not fits(row, quantize_fp8(np.zeros((256, 4096), np.float32), blocked=True), "plain")
    assert not fits(row, w, "parts", (4090, 1030, 1024))  # a boundary inside a row tile
    assert not fits(jnp.zeros((1, 16384), jnp.bfloat16), quantize_fp8(np.zeros((8, 16384), np.float32)), "plain")
    assert not fits(row, jnp.zeros((6144, 4096), jnp.bfloat16), "plain")  # not FP8


def test_the_launch_plan_walks_every_tile_with_a_few_programs_per_sm():
    config = Fp8NormGemvConfig(block_n=4, programs_per_sm=4, num_sms=132)
    plan = launch_plan(28672, 4096, "gate_up", config, add=True)
    # 7168 tiles over at most 528 programs: 14 each, so 512 programs walk them all (none idles a last round)
    assert plan["grid"] == (512, 1, 1) and plan["meta"]["TILES"] == 7168 and plan["meta"]["KWP"] == 1024
    small = launch_plan(40, 420, "plain", config, add=False)  # fewer tiles than programs: one each
    assert small["grid"] == (10, 1, 1) and small["meta"]["KWP"] == 128 and not small["meta"]["ADD"]
    parts = launch_plan(6144, 4096, "parts", config, add=True, sizes=(4096, 1024, 1024))
    assert (parts["meta"]["N1"], parts["meta"]["N2"], parts["meta"]["FORM"]) == (4096, 5120, 1)
    for bad in (dict(block_n=3), dict(block_n=1)):
        with pytest.raises(ValueError, match="block_n"):
            launch_plan(64, 64, "gate_up", Fp8NormGemvConfig(**bad), add=True)
    with pytest.raises(ValueError, match="multiple of 4"):
        launch_plan(64, 66, "plain", config, add=True)


def _triton_kernels(fn, *args) -> list[str]:
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return [re.search(r'name = "([^"]+)"', line).group(1) for line in text.splitlines() if XLA_TRITON_TARGET in line]


def test_traced_for_a_gpu_each_op_is_one_launch_and_the_switch_restores_two(monkeypatch):
    monkeypatch.setattr(fp8_module, "triton_available", lambda: True)  # as if traced for a GPU
    monkeypatch.setattr(norm_gpu, "triton_available", lambda: True)
    x, y, w = _inputs(d=4096)
    qkv = quantize_fp8(jnp.zeros((6144, 4096), jnp.float32))
    gate_up, down = quantize_fp8(jnp.zeros((2 * 1024, 4096), jnp.float32)), quantize_fp8(jnp.zeros((4096, 1024)))
    attn = lambda x, y: norm_gemv.add_rms_norm_linear_split(x, y, w, qkv, sizes=(4096, 1024, 1024), eps=1e-5)  # noqa: E731
    mlp = lambda x, y: norm_gemv.add_rms_norm_gated_mlp(x, y, w, gate_up, down, act="silu", eps=1e-5)  # noqa: E731
    assert _triton_kernels(attn, x, y) == ["fp8_norm_gemv_kernel"]
    assert _triton_kernels(mlp, x, y) == ["fp8_norm_gemv_kernel", "fp8_gemv_kernel"]  # then the down GEMV
    assert _triton_kernels(lambda x: attn(x, None), x) == ["fp8_norm_gemv_kernel"]  # layer 0: no add
    monkeypatch.setenv("EMBER_FUSED_NORM_GEMV", "0")
    assert _triton_kernels(lambda x, y: attn(x, y), x, y) == ["add_rms_norm_kernel", "fp8_gemv_parts_kernel"]
    monkeypatch.delenv("EMBER_FUSED_NORM_GEMV")
    bf16 = jnp.zeros((6144, 4096), jnp.bfloat16)  # other weights: the norm kernel, then their projection
    plain = _triton_kernels(lambda x, y: norm_gemv.add_rms_norm_linear_split(x, y, w, bf16, sizes=(4096, 1024, 1024),
                                                                             eps=1e-5), x, y)
    assert plain == ["add_rms_norm_kernel"]
