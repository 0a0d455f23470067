"""The fused decode attention kernels (compiler/kernels/attention/decode_kernel.py) in Triton's CPU interpreter,
against their unfused parts: the combine that also writes the int8 activations of the next GEMV (with 1 and 2
terms, policy quant_gemv.act_terms), and RoPE + K/V write + partials in one launch. The plain kernels:
test_decode_interpret.py."""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from decode_attention_cases import make_case, partial_buffers, rel_err
from interpreter import HostBuffer, activation_buffers, compare_activations

pytestmark = pytest.mark.interpret


def _plan(case: dict, dtype, splits: int) -> dict:
    from ember.compiler.kernels.attention.decode import decode_launch_plan

    batch, hq, dh = case["q"].shape
    _, block_size, hkv, _ = case["k_pool"].shape
    return decode_launch_plan(
        batch,
        hq,
        hkv,
        dh,
        block_size,
        case["tables"].shape[1],
        dot_fp32=dtype == np.float32,
        scale=1.0 / math.sqrt(dh),
        splits=splits,
    )


@pytest.mark.parametrize("act_terms", [1, 2], ids=["terms1", "terms2"])
@pytest.mark.parametrize("order", ["q4_k", "q6_k"])
@pytest.mark.parametrize("hq, hkv, dh", [(12, 2, 128), (8, 1, 64)], ids=["hq12-hkv2-dh128", "hq8-hkv1-dh64"])
def test_combine_quant_matches_combine_then_quantizer(hq, hkv, dh, order, act_terms, kernel_overrides):
    """paged_decode_combine_quant_kernel on the bf16 partials of 5 splits: its rows [batch, hq, dh] bit-equal to
    the plain combine kernel's, its int8 words equal to act_quant.quantize_activations of those rows, and
    (dx, sx, s0, s1) to fp32 rounding (interpreter.compare_activations)."""
    from ember.compiler.kernels.attention.decode import combine_meta
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.compiler.kernels.gguf_gemv.act_quant import quantize_activations

    kernel_overrides({"quant_gemv.act_terms": act_terms})
    splits, dtype = 5, ml_dtypes.bfloat16
    case = make_case(np.random.default_rng([hq, hkv, dh]), hq, hkv, dh, 16, 0, max_ctx=300, padding_row=True)
    batch = case["q"].shape[0]
    plan = _plan(case, dtype, splits)
    args = [
        HostBuffer(case["q"].astype(dtype)),
        HostBuffer(case["k_pool"].astype(dtype)),
        HostBuffer(case["v_pool"].astype(dtype)),
        HostBuffer(case["tables"]),
        HostBuffer(case["ctx"]),
        HostBuffer(case["ctx"] - 1),
        HostBuffer(np.asarray([0], np.int32)),
    ]
    parts = partial_buffers(batch, hkv, splits, hq // hkv, dh)
    KERNELS["partials"][plan["grid"]](*args, *parts, **plan["meta"])
    meta = combine_meta(plan["meta"], splits)
    plain = HostBuffer(np.full((batch, hq, dh), np.nan, dtype))
    KERNELS["combine"][(batch, hq)](*parts, plain, **meta)
    out = HostBuffer(np.full((batch, hq, dh), np.nan, dtype))
    qa, da = activation_buffers(batch, hq * dh)  # shaped for act_terms terms
    terms = da.array.shape[-1] // 4
    assert terms == act_terms
    KERNELS["combine_quant"][(batch, hq)](*parts, out, qa, da, Q6=order == "q6_k", ASM=False, TERMS=terms, **meta)
    rows = out.array.astype(np.float32)
    assert np.array_equal(rows, plain.array.astype(np.float32)), (
        f"rows differ from the plain combine's: max diff {np.abs(rows - plain.array.astype(np.float32)).max():.3g}"
    )
    qa_ref, da_ref = (np.asarray(a) for a in quantize_activations(jnp.asarray(rows.reshape(batch, hq * dh)), order))
    mismatch, note = compare_activations(qa.array, da.array, qa_ref, da_ref)
    assert not mismatch, note


ROPE_CASES = [  # (hq, hkv, dh), rotation style, dtype, splits (3: with a window of 21)
    ((12, 2, 128), "neox", "bfloat16", 5),
    ((8, 1, 64), "interleaved", "float32", 3),
    ((4, 2, 64), "neox", "float32", 8),
    ((12, 2, 128), "neox", "float32", 2),
]


@pytest.mark.parametrize(
    "heads, style, dtype_name, splits", ROPE_CASES, ids=[f"hq{h[0]}-{s}-{d}-splits{n}" for h, s, d, n in ROPE_CASES]
)
def test_rope_partials_match_rope_write_then_partials(heads, style, dtype_name, splits):
    """paged_decode_rope_partials_kernel against rope_write_kernel then paged_decode_partials_kernel on the same
    unrotated q [batch, hq, dh] / k, v [batch, hkv, dh]: both pools bit-equal, the merged partials equal to fp32
    rounding (the own token's score and V row are summed outside the dots), the combine kernel over them too (the
    empty splits' acc and l stay NaN, unwritten, and must not leak in), and the own token taken from registers
    (WRITE_KV=False over pools whose written slots hold NaN). Each row writes its own token where its table puts
    position ctx - 1 (the padding row: block 0, as the runtime pads)."""
    from ember.compiler.kernels.attention.decode import combine_meta, combine_partials
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.compiler.kernels.rope.kv_write import launch_plan as rope_plan
    from ember.compiler.kernels.rope.kv_write import rope_write_kernel
    from ember.compiler.kernels.rope.reference import inv_frequencies

    hq, hkv, dh = heads
    dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
    window = 21 if splits == 3 else 0
    case = make_case(
        np.random.default_rng([hq, hkv, dh, splits]), hq, hkv, dh, 16, window, max_ctx=200, padding_row=True
    )
    rng = np.random.default_rng(splits)
    batch, block_size = case["q"].shape[0], case["k_pool"].shape[1]
    q, k, v = (rng.standard_normal((batch, n, dh)).astype(dtype) for n in (hq, hkv, hkv))
    pos = (case["ctx"] - 1).astype(np.int32)
    slots = (case["tables"][np.arange(batch), pos // block_size] * block_size + pos % block_size).astype(np.int32)
    inv_freq = inv_frequencies(theta=1e6, head_dim=dh).astype(np.float32)
    plan = _plan(case, dtype, splits)
    shared = [HostBuffer(a) for a in (case["tables"], case["ctx"], pos, np.asarray([window], np.int32))]
    partials = lambda: partial_buffers(batch, hkv, splits, hq // hkv, dh)

    # two launches: rope_write (pools passed as input and aliased output, one buffer), then the partials
    pools_two = [HostBuffer(case[name].astype(dtype)) for name in ("k_pool", "v_pool")]
    q_rot = HostBuffer(np.zeros_like(q))
    rplan = rope_plan(batch, hq, hkv, dh, style)
    rope_inputs = [HostBuffer(a) for a in (q, k, v, pos, inv_freq, slots)]
    rope_write_kernel[rplan["grid"]](*rope_inputs, *pools_two, q_rot, *pools_two, **rplan["meta"])
    want = partials()
    KERNELS["partials"][plan["grid"]](q_rot, *pools_two, *shared, *want, **plan["meta"])

    def one_launch(pools, write_kv=True):  # -> the partials; the pools are written in place
        outs = partials()
        KERNELS["rope_partials"][plan["grid"]](
            *(HostBuffer(a) for a in (q, k, v, inv_freq, slots)),
            *pools,
            *shared,
            *outs,
            *pools,
            INTERLEAVED=style == "interleaved",
            WRITE_KV=write_kv,
            **plan["meta"],
        )
        return outs

    merged = lambda parts: np.asarray(combine_partials(*(jnp.asarray(p.array) for p in parts), jnp.float32))
    expected = merged(want)
    pools_one = [HostBuffer(case[name].astype(dtype)) for name in ("k_pool", "v_pool")]
    got = one_launch(pools_one)
    err = rel_err(merged(got), expected)
    combined = HostBuffer(np.full((batch, hq, dh), np.nan, np.float32))
    KERNELS["combine"][(batch, hq)](*got, combined, **combine_meta(plan["meta"], splits))
    combined_err = rel_err(combined.array, expected)
    same = lambda a, b: np.array_equal(a.array.astype(np.float32), b.array.astype(np.float32), equal_nan=True)
    pools_equal = all(same(a, b) for a, b in zip(pools_one, pools_two))
    stale = [case[name].astype(dtype) for name in ("k_pool", "v_pool")]
    for pool in stale:
        pool.reshape(-1, *pool.shape[2:])[slots] = np.nan
    own_err = rel_err(merged(one_launch([HostBuffer(pool) for pool in stale], write_kv=False)), expected)
    note = (
        f"partials rel_err={err:.1e} combine kernel rel_err={combined_err:.1e} pools equal={pools_equal} "
        f"own token unwritten rel_err={own_err:.1e}"
    )
    assert err < 1e-5 and combined_err < 1e-5 and pools_equal and own_err < 1e-5, note
