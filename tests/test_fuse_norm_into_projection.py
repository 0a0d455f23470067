"""compiler/passes/fuse_norm_into_projection.py and compiler/kernels/norm/quant_kernel.py: a norm read by one
projection learns that projection's weight (h200, default variant; nowhere else), and on a GPU writes the
projection's int8 activations in its own launch (on by default; the kernel policy's norms.fused_quant), so
the decode GEMV runs without a quantizer launch."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from plan_graphs import SPECS, read_elsewhere

from ember.compiler.kernels.gguf_gemv import linear as linear_quant
from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
from ember.compiler.kernels.norm import quant_kernel as norm_quant_gpu
from ember.compiler.kernels.norm import reference as norm
from ember.compiler.passes.fuse_norm_into_projection import fuse_norm_into_projection
from ember.compiler.pipeline import compile_graph
from ember.compiler.spec import load_spec
from ember.compiler.targets import get_target
from ember.compiler.targets.policy import overriding


def _nodes(graph, op, region="layer"):
    return [n for n in graph.region(region).nodes if n.op == op]


@pytest.mark.parametrize("spec", SPECS)
def test_h200_default_plans_tell_each_norm_its_projection(spec):
    loaded = load_spec(spec)
    fused = compile_graph(loaded, get_target("h200"))
    readers = [n.weight("reader") for op in ("rms_norm_to_proj", "add_rms_norm_to_proj") for n in _nodes(fused, op)]
    assert any(r.startswith("attn_q") for r in readers) or any(r.startswith("ffn_gate") for r in readers)
    for node in _nodes(fused, "rms_norm_to_proj") + _nodes(fused, "add_rms_norm_to_proj"):
        consumer = [n for n in fused.region("layer").nodes if node.outputs[-1] in n.inputs]
        # a projection, or the gated_mlp (fuse_gated_mlp) whose first projection is the reader
        read_by = consumer[0].weight("gate_up" if consumer[0].op == "gated_mlp" else "weight")
        assert len(consumer) == 1 and read_by == node.weight("reader")
    if spec.endswith(("qwen2.toml", "llama.toml")):  # both layer norms feed projections, the head's too; both
        # add the residual (the first one the add the layer before left it: defer_residual_add)
        assert not _nodes(fused, "rms_norm_to_proj") and len(_nodes(fused, "add_rms_norm_to_proj")) == 2
        assert _nodes(fused, "rms_norm_to_proj", "epilogue")[0].weight("reader") == "output.weight"
    for graph in (
        compile_graph(loaded, get_target("h200"), variant="deterministic"),
        compile_graph(loaded, get_target("cpu")),
    ):
        assert not _nodes(graph, "rms_norm_to_proj") and not _nodes(graph, "add_rms_norm_to_proj")


def test_a_norm_read_by_more_than_its_projection_stays_plain():
    graph = compile_graph(load_spec("specs/qwen2.toml"), get_target("cpu"))
    layer = graph.region("layer")
    plain = next(n for n in layer.nodes if n.op == "add_rms_norm")
    assert len(_nodes(fuse_norm_into_projection(graph), "add_rms_norm_to_proj")) == 2
    graph = read_elsewhere(graph, plain.outputs[1])
    assert len(_nodes(fuse_norm_into_projection(graph), "add_rms_norm_to_proj")) == 1


def test_off_the_gpu_the_norms_are_the_references():
    rng = np.random.default_rng(0)
    x, y = (jnp.asarray(rng.standard_normal((2, 256)), jnp.float32) for _ in range(2))
    w = jnp.asarray(rng.uniform(0.5, 1.5, 256), jnp.float32)
    reader = pack(random_gguf_bytes(rng, "q4_k", (64, 256)), "q4_k", (64, 256))
    np.testing.assert_array_equal(
        norm_quant_gpu.rms_norm_to_proj(x, w, reader, eps=1e-6), norm.rms_norm(x, w, eps=1e-6)
    )
    for got, want in zip(
        norm_quant_gpu.add_rms_norm_to_proj(x, y, w, reader, eps=1e-6), norm.add_rms_norm(x, y, w, eps=1e-6)
    ):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("add", [False, True], ids=["rms_norm", "add_rms_norm"])
def test_decode_norm_then_qkv_lowers_to_two_kernels(add, monkeypatch, kernel_overrides):
    """1.5B attention input at batch 1: the norm writes q+k+v's int8 activations (its packing: Q4_K), then the
    parts GEMV; no quantizer launch between them."""
    from ember.compiler.kernels.norm import kernel as norm_gpu
    from ember.compiler.kernels.triton.launch import XLA_TRITON_TARGET

    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    monkeypatch.setattr(norm_gpu, "triton_available", lambda: True)
    w = pack(random_gguf_bytes(np.random.default_rng(0), "q4_k", (2048, 1536)), "q4_k", (2048, 1536))
    x, nw = jnp.zeros((1, 1536), jnp.bfloat16), jnp.ones((1536,), jnp.bfloat16)
    kernel_overrides({"norms.fused_quant": False})
    with overriding({"quant_gemv.backend": "triton"}):  # the switch that turns it off
        plain = jax.eval_shape(lambda x, nw, w: norm_quant_gpu.rms_norm_to_proj(x, nw, w, eps=1e-6), x, nw, w)
        assert not isinstance(plain, linear_quant.QuantizedInput) and plain.shape == x.shape
    kernel_overrides({"norms.fused_quant": True})  # on by default

    def step(x, nw, w):
        h = (
            norm_quant_gpu.add_rms_norm_to_proj(x, x, nw, w, eps=1e-6)[1]
            if add
            else norm_quant_gpu.rms_norm_to_proj(x, nw, w, eps=1e-6)
        )
        assert isinstance(h, linear_quant.QuantizedInput) and h.order == "q4_k"
        return linear_quant.linear_split(h, w, sizes=(1536, 256, 256))

    with overriding({"quant_gemv.backend": "triton"}):
        text = jax.jit(step).trace(x, nw, w).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if XLA_TRITON_TARGET in line]
    assert len(calls) == 2  # no quantizer launch between the norm and the GEMV
    assert f'name = "{"add_" if add else ""}rms_norm_quant_kernel"' in calls[0]
    assert 'name = "dp4a_gemv_parts_kernel"' in calls[1]


@pytest.mark.parametrize("pair", [True, False], ids=["pair", "apart"])
def test_a_q6_k_v_part_reads_the_norms_q4_k_activations(pair, monkeypatch, kernel_overrides):
    """1.5B Q4_K_M layers with a Q6_K v: the norm writes Q4_K-packed activations, which the q+k part and the
    Q6_K v part both read (the v kernel permutes their bytes, ACT_Q4): no quantizer launch, and both parts
    in one launch (dp4a_gemv_pair_kernel), or one each with quant_gemv.pair_launch off."""
    from ember.compiler.kernels.gguf_gemv.layout import WeightGroup
    from ember.compiler.kernels.norm import kernel as norm_gpu
    from ember.compiler.kernels.triton.launch import XLA_TRITON_TARGET

    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    monkeypatch.setattr(norm_gpu, "triton_available", lambda: True)
    kernel_overrides({"quant_gemv.pair_launch": pair})
    rng = np.random.default_rng(0)
    w = WeightGroup(
        (
            pack(random_gguf_bytes(rng, "q4_k", (1792, 1536)), "q4_k", (1792, 1536)),
            pack(random_gguf_bytes(rng, "q6_k", (256, 1536)), "q6_k", (256, 1536)),
        )
    )
    x, nw = jnp.zeros((1, 1536), jnp.bfloat16), jnp.ones((1536,), jnp.bfloat16)
    bias = jnp.zeros((2048,), jnp.bfloat16)

    def step(x, nw, w, bias):
        h = norm_quant_gpu.rms_norm_to_proj(x, nw, w, eps=1e-6)
        assert isinstance(h, linear_quant.QuantizedInput) and h.order == "q4_k"
        return linear_quant.linear_split(h, w, bias, sizes=(1536, 256, 256))

    with overriding({"quant_gemv.backend": "triton"}):
        text = jax.jit(step).trace(x, nw, w, bias).lower(lowering_platforms=("cuda",)).as_text()
        outs = jax.eval_shape(step, x, nw, w, bias)
    calls = [re.search(r'name = "([^"]+)"', line).group(1) for line in text.splitlines() if XLA_TRITON_TARGET in line]
    parts = ["dp4a_gemv_pair_kernel"] if pair else ["dp4a_gemv_parts_kernel"] * 2
    assert calls == ["rms_norm_quant_kernel", *parts]
    assert [o.shape for o in outs] == [(1, 1536), (1, 256), (1, 256)]
    assert "stablehlo.slice" not in text and "stablehlo.add" not in text


@pytest.mark.parametrize("spec", SPECS)
def test_h200_default_plans_tell_the_attention_its_output_projection(spec):
    loaded = load_spec(spec)
    fused = compile_graph(loaded, get_target("h200"))
    nodes = _nodes(fused, "rope_attention_to_proj")
    assert len(nodes) == 1 and not _nodes(fused, "rope_attention")
    consumer = [n for n in fused.region("layer").nodes if nodes[0].outputs[0] in n.inputs]
    assert len(consumer) == 1 and consumer[0].weight("weight") == nodes[0].weight("reader") == "attn_output.weight"
    for graph in (
        compile_graph(loaded, get_target("h200"), variant="deterministic"),
        compile_graph(loaded, get_target("cpu")),
    ):
        assert not _nodes(graph, "rope_attention_to_proj")


@pytest.mark.parametrize("order, fused", [("q4_k", True), ("q6_k", True), ("q4_k", False)])
def test_decode_attention_writes_the_output_projections_int8_activations(monkeypatch, order, fused, kernel_overrides):
    """1.5B shape at batch 1 in a wide table (65 splits): by default the attention's combine also writes the o
    projection's int8 activations in its packing, and the GEMV follows with no quantizer launch; with
    attention.fused_combine_quant off the combine writes the rows and the quantizer runs before the GEMV."""
    from ember.compiler.batch import StepBatch
    from ember.compiler.kernels.attention import paged
    from ember.compiler.kernels.triton.launch import XLA_TRITON_TARGET

    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    monkeypatch.setattr(paged, "triton_available", lambda: True)
    kernel_overrides({"attention.fused_combine_quant": fused})
    hq, hkv, dh, width = 12, 2, 128, 1033
    w = pack(random_gguf_bytes(np.random.default_rng(0), order, (1536, 1536)), order, (1536, 1536))
    q, k, v = (jnp.zeros((1, heads, dh), jnp.bfloat16) for heads in (hq, hkv, hkv))
    pool = jnp.zeros((width + 1, 16, hkv, dh), jnp.bfloat16)
    zeros = np.zeros(1, np.int32)
    batch = StepBatch(
        tokens=zeros,
        positions=zeros,
        slots=np.zeros((1, 1), np.int32),
        dec_block_tables=np.zeros((1, 1, width), np.int32),
        dec_ctx_lens=np.ones(1, np.int32),
        pre_block_table=np.zeros((1, 1, width), np.int32),
        logit_rows=zeros,
    )
    inv_freq = jnp.ones((dh // 2,), jnp.float32)

    def step(q, k, v, pool, w):
        a, _, _ = paged.rope_paged_attention_to_proj(
            q,
            k,
            v,
            batch.positions,
            inv_freq,
            jnp.int32(0),
            jnp.int32(0),
            w,
            pool,
            pool,
            batch,
            style="neox",
            scale=0.1,
        )
        assert isinstance(a, linear_quant.QuantizedInput) == fused
        return linear_quant.linear(a, w)

    with overriding({"quant_gemv.backend": "triton"}):
        text = jax.jit(step).trace(q, k, v, pool, w).lower(lowering_platforms=("cuda",)).as_text()
    names = [line.split('name = "')[1].split('"')[0] for line in text.splitlines() if XLA_TRITON_TARGET in line]
    merge = ["paged_decode_combine_quant_kernel"] if fused else ["paged_decode_combine_kernel", "quantize_rows_kernel"]
    assert names == ["paged_decode_rope_partials_kernel", *merge, "dp4a_gemv_kernel"]  # RoPE inside the partials
