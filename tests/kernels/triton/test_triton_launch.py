"""compiler/kernels/triton/launch.py: every Triton kernel the h200 plans launch lowers, on this CPU machine, to
XLA's native Triton custom call with its Triton IR, grid and launch knobs — what the H200 then compiles and
runs (the kernels' numerics are checked there, tests/kernels/*/*_gpu.py, and in Triton's interpreter, tests/kernels/*/*_interpret.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from triton_calls import triton_calls

from ember.compiler.kernels.attention.decode import decode_launch_plan, paged_decode_attention
from ember.compiler.kernels.attention.prefill import launch_plan as prefill_launch_plan
from ember.compiler.kernels.attention.prefill import pick_config, prefill_attention
from ember.compiler.kernels.gguf_gemv.config import QuantMatmulConfig
from ember.compiler.kernels.gguf_gemv.config import pick_config as pick_quant_config
from ember.compiler.kernels.gguf_gemv.layout import pack, random_gguf_bytes
from ember.compiler.kernels.gguf_gemv.matmul import launch_plan as quant_launch_plan
from ember.compiler.kernels.gguf_gemv.matmul import triton_quant_matmul
from ember.compiler.kernels.triton.launch import kernel_ttir, triton_call
from ember.compiler.targets.policy import overriding

BF16 = jnp.bfloat16


@pytest.mark.parametrize("rows, width", [(1, 2048), (8, 32), (256, 32)])
def test_decode_attention_lowers_to_native_kernels(rows, width):
    # one kernel when a row's tokens take one split; else the split partials, then their combine (one program per
    # row and query head)
    hq, hkv, dh, bs = 32, 8, 128, 16
    q = jnp.zeros((rows, hq, dh), BF16)
    pool = jnp.zeros((64, bs, hkv, dh), BF16)
    tables = jnp.zeros((rows, width), jnp.int32)
    lens = jnp.ones((rows,), jnp.int32)
    calls = triton_calls(
        lambda q, p, t, n: paged_decode_attention(q, p, p, t, n, n - 1, jnp.int32(0), scale=0.1, backend="triton"),
        q,
        pool,
        tables,
        lens,
    )
    plan = decode_launch_plan(rows, hq, hkv, dh, bs, width, dot_fp32=False, scale=0.1)
    single = plan["splits"] == 1
    assert [c["name"] for c in calls] == (
        ["paged_decode_kernel"] if single else ["paged_decode_partials_kernel", "paged_decode_combine_kernel"]
    )
    assert calls[0]["grid"] == plan["grid"]
    if not single:
        assert calls[1]["grid"] == (rows, hq, 1)
    for call in calls:
        assert "tt.func public @" + call["name"] in call["ir"].replace("\\22", '"')


@pytest.mark.parametrize("dtype", [BF16, jnp.float32])
def test_prefill_attention_lowers_to_one_native_kernel(dtype):
    chunk, hq, hkv, dh, bs, width = 512, 32, 8, 128, 16, 64
    q = jnp.zeros((chunk, hq, dh), dtype)
    pool = jnp.zeros((width + 1, bs, hkv, dh), dtype)
    calls = triton_calls(
        lambda q, p, t, pos: prefill_attention(q, p, p, t, pos, jnp.int32(chunk), jnp.int32(0), scale=0.1),
        q,
        pool,
        jnp.zeros((width,), jnp.int32),
        jnp.arange(chunk, dtype=jnp.int32),
    )
    plan = prefill_launch_plan(chunk, hq, hkv, dh, bs, width, scale=0.1, config=pick_config(dh, dtype))
    assert [c["name"] for c in calls] == ["prefill_attention_kernel"]
    assert calls[0]["grid"] == tuple(plan.grid) + (1,) * (3 - len(plan.grid))


@pytest.mark.parametrize(
    "fmt, rows, out, inner, variant",
    [
        ("q4_k", 1, 1536, 1536, "split"),
        ("q4_k", 16, 8960, 1536, "split"),
        ("q6_k", 1, 1536, 8960, "split"),
        ("q8_0", 4, 256, 1536, "split"),
        ("q4_k", 1, 4096, 14336, "rows"),
        ("q4_k", 3, 1536, 1536, "rows"),
        ("q4_k", 1, 17920, 1536, "dp4a"),
        ("q6_k", 11, 151936, 1536, "dp4a"),
        ("q5_0", 1, 4096, 640, "rows"),
        ("q5_0", 8, 1536, 640, "split"),
    ],
)
def test_quantized_gemv_lowers_to_native_kernels(fmt, rows, out, inner, variant, kernel_overrides):
    from ember.compiler.kernels.gguf_gemv.act_quant_kernel import quantize_plan

    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"] if variant == "dp4a" else []})
    weight = pack(random_gguf_bytes(np.random.default_rng(0), fmt, (out, inner)), fmt, (out, inner))
    config = pick_quant_config(fmt, rows, out, inner)
    if variant == "rows":
        config = QuantMatmulConfig(variant="rows", block_n=32)
    assert config.variant == variant or (variant == "split" and config.variant in ("split", "rows"))
    calls = triton_calls(lambda x, w: triton_quant_matmul(x, w, config), jnp.zeros((rows, inner), BF16), weight)
    plan = quant_launch_plan(fmt, rows, out, inner, config)
    if variant == "dp4a":  # the activations' quantizer, then the integer-dot GEMV
        assert [c["name"] for c in calls] == ["quantize_rows_kernel", "dp4a_gemv_kernel"]
        assert calls[0]["grid"] == quantize_plan(rows, inner, fmt)["grid"]
        calls = calls[1:]
    assert len(calls) == 1 and calls[0]["grid"] == tuple(plan["grid"])
    assert (calls[0]["num_warps"], calls[0]["num_stages"]) == (config.num_warps, config.num_stages)


@pytest.mark.parametrize("grouped", [False, True], ids=["qkv", "qk+v"])
def test_packed_qkv_decode_writes_each_projection_apart(grouped, kernel_overrides):
    """1.5B qkv at batch 1 (one split): the parts kernel writes q, k, v with their bias, so nothing but the
    quantizer and the GEMVs runs (no slice or add kernel after them); a Q4_K q+k beside a Q6_K v is one
    pair launch (v's bias read at its offset)."""
    from ember.compiler.kernels.gguf_gemv import linear as linear_quant
    from ember.compiler.kernels.gguf_gemv.layout import WeightGroup

    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    rng, sizes = np.random.default_rng(0), (1536, 256, 256)

    def weight(fmt, rows):
        return pack(random_gguf_bytes(rng, fmt, (rows, 1536)), fmt, (rows, 1536))

    w = WeightGroup((weight("q4_k", 1792), weight("q6_k", 256))) if grouped else weight("q4_k", 2048)
    with overriding({"quant_gemv.backend": "triton"}):
        fn = lambda x, w, b: linear_quant.linear_split(x, w, b, sizes=sizes)  # noqa: E731
        text = (
            jax.jit(fn)
            .trace(jnp.zeros((1, 1536), BF16), w, jnp.zeros((2048,), BF16))
            .lower(lowering_platforms=("cuda",))
            .as_text()
        )
        calls = triton_calls(fn, jnp.zeros((1, 1536), BF16), w, jnp.zeros((2048,), BF16))
        outs = jax.eval_shape(fn, jnp.zeros((1, 1536), BF16), w, jnp.zeros((2048,), BF16))
    names = [c["name"] for c in calls]
    # a Q4_K q+k beside a Q6_K v: one quantizer (Q4_K packing, which the v part reads) and one pair launch
    assert names == ["quantize_rows_kernel", "dp4a_gemv_pair_kernel" if grouped else "dp4a_gemv_parts_kernel"]
    assert "stablehlo.slice" not in text and "stablehlo.add" not in text
    assert [o.shape for o in outs] == [(1, n) for n in sizes] and all(o.dtype == BF16 for o in outs)


@pytest.mark.parametrize(
    "fmt, d, ffn, by_norm", [("q4_k", 1536, 8960, True), ("q6_k", 1536, 8960, True), ("q4_k", 4096, 14336, False)]
)
def test_down_projection_partials_are_summed_by_the_next_norm(fmt, d, ffn, by_norm, monkeypatch, kernel_overrides):
    """A down projection (split-K) at batch 1 marked partials=True (carry_split_k_partials) into the next
    layer's add_rms_norm_to_proj: its quantizer, GEMV and the norm kernel, and no XLA reduce between them
    (1.5B); unmarked, or with more partials per row than PARTIALS_MAX_BYTES (8B: 8 x 4096 fp32), XLA sums
    them (stablehlo.reduce) before the norm."""
    from ember.compiler.kernels.gguf_gemv import linear as linear_quant
    from ember.compiler.kernels.norm import kernel as norm_gpu
    from ember.compiler.kernels.norm import quant_kernel as norm_quant_gpu

    kernel_overrides({"quant_gemv.dp4a_formats": ["q4_k", "q6_k"]})
    monkeypatch.setattr(norm_gpu, "triton_available", lambda: True)
    rng = np.random.default_rng(0)
    down = pack(random_gguf_bytes(rng, fmt, (d, ffn)), fmt, (d, ffn))
    qkv = pack(random_gguf_bytes(rng, "q4_k", (d + 512, d)), "q4_k", (d + 512, d))
    splits = quant_launch_plan(fmt, 1, d, ffn, pick_quant_config(fmt, 1, d, ffn))["split_k"]
    assert splits > 1 and (splits * d * 4 <= norm_quant_gpu.PARTIALS_MAX_BYTES) is by_norm
    args = (jnp.zeros((1, d), BF16), jnp.zeros((1, 2 * ffn), BF16), jnp.ones((d,), BF16), down, qkv)
    for partials in (True, False):

        def fn(x, gate_up, norm_w, down, qkv):
            t = linear_quant.gated_linear(gate_up, down, act="silu", partials=partials)
            s, h = norm_quant_gpu.add_rms_norm_to_proj(x, t, norm_w, qkv, eps=1e-6)
            return s, h.qa, h.da

        with overriding({"quant_gemv.backend": "triton"}):
            text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
            calls = triton_calls(fn, *args)
        assert [c["name"] for c in calls] == ["quantize_rows_kernel", "dp4a_gemv_kernel", "add_rms_norm_quant_kernel"]
        assert ("stablehlo.reduce" in text) is not (partials and by_norm)


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * FACTOR, mask=offsets < n)


def test_plain_scalars_are_specialised_and_pointers_aligned():
    ir, name = kernel_ttir(_scale_kernel, ("*fp32", "*fp32"), (("BLOCK", 128), ("FACTOR", 3.0), ("n", 1000)), 4, 3)
    assert name == "_scale_kernel"
    signature = re.search(r"tt.func public @_scale_kernel\((.*?)\) attributes", ir).group(1)
    assert signature.count("!tt.ptr<f32>") == 2 and signature.count("tt.divisibility = 16") == 2
    assert "i32" not in signature.replace("divisibility = 16 : i32", "")  # n is a constant, not an argument
    assert "1000" in ir


def test_arguments_that_do_not_fit_are_refused():
    x = jnp.zeros((1000,), jnp.float32)
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    call = lambda *arrays, **constants: (
        jax.jit(  # noqa: E731
            lambda *a: triton_call(*a, kernel=_scale_kernel, out_shape=out, grid=(8,), **constants)
        )
        .trace(*arrays)
        .lower(lowering_platforms=("cuda",))
    )
    with pytest.raises(TypeError, match="takes pointers"):
        call(x, x, n=1000, FACTOR=2.0, BLOCK=128)  # one array too many
    with pytest.raises(TypeError, match="no arguments"):
        call(x, n=1000, FACTOR=2.0, BLOCK=128, SPEED=1)
    with pytest.raises(ValueError, match="grid"):
        jax.jit(
            lambda a: triton_call(a, kernel=_scale_kernel, out_shape=out, grid=(0,), n=1000, FACTOR=2.0, BLOCK=128)
        ).trace(x)


@pytest.mark.parametrize("shape", [(1, 4096), (3, 1536), (256, 4096)])
def test_rms_norm_kernels_lower_to_one_native_kernel_each(shape):
    from ember.compiler.kernels.norm.kernel import add_rms_norm_triton, launch_plan, rms_norm_triton

    x, w = jnp.zeros(shape, BF16), jnp.ones(shape[-1:], BF16)
    plan = launch_plan(shape[0], shape[1])
    alone = triton_calls(lambda x, w: rms_norm_triton(x, w, eps=1e-5), x, w)
    fused = triton_calls(lambda x, y, w: add_rms_norm_triton(x, y, w, eps=1e-5), x, x, w)
    for calls, name in ((alone, "rms_norm_kernel"), (fused, "add_rms_norm_kernel")):
        assert len(calls) == 1 and calls[0]["name"] == name
        assert calls[0]["grid"] == (shape[0], 1, 1) and calls[0]["num_warps"] == plan["num_warps"]


@pytest.mark.parametrize("n, hq, hkv, style", [(1, 12, 2, "neox"), (256, 32, 8, "neox"), (4, 6, 3, "interleaved")])
def test_rope_write_lowers_to_one_native_kernel_writing_the_pools_in_place(n, hq, hkv, style):
    from ember.compiler.kernels.rope.kv_write import launch_plan, rope_write

    dh = 128 if style == "neox" else 64
    q, k = jnp.zeros((n, hq, dh), BF16), jnp.zeros((n, hkv, dh), BF16)
    pool = jnp.zeros((8, 16, hkv, dh), BF16)
    ints = jnp.zeros((n,), jnp.int32)
    fn = lambda q, k, v, p, f, s, kp, vp: rope_write(q, k, v, p, f, s, kp, vp, style=style)  # noqa: E731
    args = (q, k, k, ints, jnp.zeros((dh // 2,), jnp.float32), ints, pool, pool)
    calls = triton_calls(fn, *args)
    plan = launch_plan(n, hq, hkv, dh, style)
    assert len(calls) == 1 and calls[0]["name"] == "rope_write_kernel"
    assert calls[0]["grid"] == (n, 1, 1) and calls[0]["num_warps"] == plan["num_warps"]
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "output_operand_aliases" in text  # the pools are updated in place, not copied


@pytest.mark.parametrize("rows, width, style", [(1, 2048, "neox"), (2, 512, "interleaved"), (256, 32, "neox")])
def test_rope_decode_attention_lowers_to_one_partials_kernel_writing_the_pools(rows, width, style):
    # a step of decode rows with split partials: RoPE, the K/V write and the partials in one launch, then the
    # combine (no rope_write); one split (large batches): not applicable, the caller keeps the two launches
    from ember.compiler.kernels.attention.decode import rope_decode_attention

    hq, hkv, dh, bs = 32, 8, 128, 16
    q, k = jnp.zeros((rows, hq, dh), BF16), jnp.zeros((rows, hkv, dh), BF16)
    pool = jnp.zeros((64, bs, hkv, dh), BF16)
    tables = jnp.zeros((rows, width), jnp.int32)
    ints = jnp.ones((rows,), jnp.int32)
    freq = jnp.zeros((dh // 2,), jnp.float32)

    def step(q, k, pool, tables, n):
        return rope_decode_attention(
            q, k, k, n - 1, freq, n, pool, pool, tables, n, jnp.int32(0), style=style, scale=0.1
        )

    plan = decode_launch_plan(rows, hq, hkv, dh, bs, width, dot_fp32=False, scale=0.1)
    if plan["splits"] == 1:
        assert step(q, k, pool, tables, ints) is None
        return
    calls = triton_calls(step, q, k, pool, tables, ints)
    assert [c["name"] for c in calls] == ["paged_decode_rope_partials_kernel", "paged_decode_combine_kernel"]
    assert calls[0]["grid"] == plan["grid"]
    text = jax.jit(step).trace(q, k, pool, tables, ints).lower(lowering_platforms=("cuda",)).as_text()
    assert "output_operand_aliases" in text  # the pools are updated in place, not copied


@pytest.mark.parametrize("fused", [True, False])
def test_rope_attention_of_a_decode_step_launches_the_fused_partials_when_switched_on(
    monkeypatch, fused, kernel_overrides
):
    # the h200 rope_attention op at batch 1 in a wide table (splits > 1): attention.fused_rope_decode on -> the
    # RoPE-fused partials and the combine; "0" -> rope_write, the partials, the combine
    from ember.compiler.batch import StepBatch
    from ember.compiler.kernels.attention import paged

    monkeypatch.setattr(paged, "triton_available", lambda: True)
    kernel_overrides({"attention.fused_rope_decode": fused})
    hq, hkv, dh, width = 12, 2, 128, 1033
    q, k = jnp.zeros((1, hq, dh), BF16), jnp.zeros((1, hkv, dh), BF16)
    pool = jnp.zeros((width + 1, 16, hkv, dh), BF16)
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
    freq = jnp.ones((dh // 2,), jnp.float32)

    def step(q, k, pool):
        return paged.rope_paged_attention(
            q, k, k, batch.positions, freq, jnp.int32(0), jnp.int32(0), pool, pool, batch, style="neox", scale=0.1
        )

    names = [c["name"] for c in triton_calls(step, q, k, pool)]
    assert names == (
        ["paged_decode_rope_partials_kernel", "paged_decode_combine_kernel"]
        if fused
        else ["rope_write_kernel", "paged_decode_partials_kernel", "paged_decode_combine_kernel"]
    )
