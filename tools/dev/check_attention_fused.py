"""The fused decode attention kernels against their unfused parts, in Triton's interpreter (for
tools/dev/check_attention_kernels.py): the combine that also writes int8 activations, and RoPE + K/V write +
partials in one launch."""

from __future__ import annotations

import math

import numpy as np

from ember.tools.dev.check_attention_cases import host_buffer


def check_combine_quant(case: dict, order: str, splits: int = 5) -> tuple[bool, str]:
    """paged_decode_combine_quant_kernel on bf16 partials: its rows bit-equal to the plain combine kernel's, its
    int8 words equal to act_quant.quantize_activations of those rows, (dx, sx, s0, s1) to fp32 rounding."""
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.attention.decode import combine_meta, decode_launch_plan
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.compiler.kernels.gguf_gemv.act_quant import quantize_activations
    from ember.tools.dev.check_dp4a_kernels import activation_buffers, compare_activations

    dtype = ml_dtypes.bfloat16
    q = case["q"].astype(dtype)
    batch, hq, dh = q.shape
    _, block_size, hkv, _ = case["k_pool"].shape
    plan = decode_launch_plan(
        batch,
        hq,
        hkv,
        dh,
        block_size,
        case["tables"].shape[1],
        dot_fp32=False,
        scale=1.0 / math.sqrt(dh),
        splits=splits,
    )
    args = [
        host_buffer(q),
        host_buffer(case["k_pool"].astype(dtype)),
        host_buffer(case["v_pool"].astype(dtype)),
        host_buffer(case["tables"]),
        host_buffer(case["ctx"]),
        host_buffer(case["ctx"] - 1),
        host_buffer(np.asarray([0], np.int32)),
    ]
    g = hq // hkv
    parts = [
        host_buffer(np.full(shape, np.nan, np.float32))
        for shape in ((batch, hkv, splits, g, dh), (batch, hkv, splits, g), (batch, hkv, splits, g))
    ]
    KERNELS["partials"][plan["grid"]](*args, *parts, **plan["meta"])
    meta = combine_meta(plan["meta"], splits)
    plain = host_buffer(np.full((batch, hq, dh), np.nan, dtype))
    KERNELS["combine"][(batch, hq)](*parts, plain, **meta)
    out = host_buffer(np.full((batch, hq, dh), np.nan, dtype))
    qa, da = activation_buffers(batch, hq * dh)
    KERNELS["combine_quant"][(batch, hq)](
        *parts, out, qa, da, Q6=order == "q6_k", ASM=False, TERMS=da.array.shape[-1] // 4, **meta
    )
    rows_equal = np.array_equal(out.array.astype(np.float32), plain.array.astype(np.float32))
    qa_ref, da_ref = (
        np.asarray(a)
        for a in quantize_activations(jnp.asarray(out.array.astype(np.float32).reshape(batch, hq * dh)), order)
    )
    mismatch, note = compare_activations(qa.array, da.array, qa_ref, da_ref)
    return not rows_equal or mismatch, f"rows equal={rows_equal} {note}"


def check_rope_partials(case: dict, style: str, dtype, splits: int) -> tuple[bool, str]:
    """paged_decode_rope_partials_kernel against rope_write_kernel then paged_decode_partials_kernel on the same
    unrotated q / k / v: both pools bit-equal, the merged partials equal to fp32 rounding (the own token's score
    and V row are summed outside the dots). Each row writes its own token where its table puts position
    ctx - 1 (the padding row: block 0, as the runtime pads)."""
    import jax.numpy as jnp

    from ember.compiler.kernels.attention.decode import combine_meta, combine_partials, decode_launch_plan
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.compiler.kernels.rope.kv_write import launch_plan as rope_plan
    from ember.compiler.kernels.rope.kv_write import rope_write_kernel
    from ember.compiler.kernels.rope.reference import inv_frequencies

    rng = np.random.default_rng(splits)
    batch, hq, dh = case["q"].shape
    _, block_size, hkv, _ = case["k_pool"].shape
    q, k, v = (rng.standard_normal((batch, heads, dh)).astype(dtype) for heads in (hq, hkv, hkv))
    pos = (case["ctx"] - 1).astype(np.int32)
    slots = (case["tables"][np.arange(batch), pos // block_size] * block_size + pos % block_size).astype(np.int32)
    inv_freq = inv_frequencies(theta=1e6, head_dim=dh).astype(np.float32)
    plan = decode_launch_plan(
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
    g, shared = (
        hq // hkv,
        [
            host_buffer(case["tables"]),
            host_buffer(case["ctx"]),
            host_buffer(pos),
            host_buffer(np.asarray([case["window"]], np.int32)),
        ],
    )
    partials = lambda: [
        host_buffer(np.full(shape, np.nan, np.float32))
        for shape in ((batch, hkv, splits, g, dh), (batch, hkv, splits, g), (batch, hkv, splits, g))
    ]
    # two launches: rope_write (pools passed as input and aliased output, one buffer), then the partials
    pools_two = [host_buffer(case[name].astype(dtype)) for name in ("k_pool", "v_pool")]
    q_rot = host_buffer(np.zeros_like(q))
    rplan = rope_plan(batch, hq, hkv, dh, style)
    rope_write_kernel[rplan["grid"]](
        host_buffer(q),
        host_buffer(k),
        host_buffer(v),
        host_buffer(pos),
        host_buffer(inv_freq),
        host_buffer(slots),
        *pools_two,
        q_rot,
        *pools_two,
        **rplan["meta"],
    )
    want = partials()
    KERNELS["partials"][plan["grid"]](q_rot, *pools_two, *shared, *want, **plan["meta"])

    def one_launch(pools, write_kv=True):  # -> the partials; the pools are written in place
        outs = partials()
        KERNELS["rope_partials"][plan["grid"]](
            host_buffer(q),
            host_buffer(k),
            host_buffer(v),
            host_buffer(inv_freq),
            host_buffer(slots),
            *pools,
            *shared,
            *outs,
            *pools,
            INTERLEAVED=style == "interleaved",
            WRITE_KV=write_kv,
            **plan["meta"],
        )
        return outs

    pools_one = [host_buffer(case[name].astype(dtype)) for name in ("k_pool", "v_pool")]
    got = one_launch(pools_one)
    same = lambda a, b: np.array_equal(a.array.astype(np.float32), b.array.astype(np.float32), equal_nan=True)
    merged = lambda parts: np.asarray(combine_partials(*(jnp.asarray(p.array) for p in parts), jnp.float32))
    reference = merged(want)
    close = lambda parts: float(np.abs(merged(parts) - reference).max() / np.abs(reference).max())  # NaN: fails
    err = close(got)
    # the combine kernel over them too: the empty splits' acc and l stay NaN (unwritten) and must not leak in
    combined = host_buffer(np.full((batch, hq, dh), np.nan, np.float32))
    KERNELS["combine"][(batch, hq)](*got, combined, **combine_meta(plan["meta"], splits))
    combined_err = float(np.abs(combined.array - reference).max() / np.abs(reference).max())
    err = err if combined_err <= err else combined_err  # NaN propagates (max() would drop it)
    pools_equal = all(same(a, b) for a, b in zip(pools_one, pools_two))
    # the own token from registers: pools whose written slots hold NaN, left unwritten (WRITE_KV=False)
    stale = [case[name].astype(dtype) for name in ("k_pool", "v_pool")]
    for pool in stale:
        pool.reshape(-1, *pool.shape[2:])[slots] = np.nan
    own_err = close(one_launch([host_buffer(pool) for pool in stale], write_kv=False))
    return not (err < 1e-5 and own_err < 1e-5 and pools_equal), (
        f"rel_err={err:.1e} pools equal={pools_equal} own token unwritten rel_err={own_err:.1e}"
    )
