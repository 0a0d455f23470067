"""Check the Triton split-K decode attention kernels without a GPU (needs only triton==3.6.0).

  python tools/dev/check_attention_kernels.py interpret   run the kernels in Triton's CPU interpreter against the
                                                      reference `_attend` (small ragged shapes, GQA 1/4/6/8,
                                                      dh 64/80/128, blocks of 16/32, windows, splits 1..8,
                                                      fp32 and bf16, FP8 (e4m3) pools under bf16 q; sliding
                                                      tables whose dropped entries point
                                                      at a NaN-filled block 0 the kernel must never read;
                                                      RoPE + K/V write + partials in one launch against
                                                      rope_write then the partials: pools bit for bit,
                                                      output to fp32 rounding)
  python tools/dev/check_attention_kernels.py combine-quant  only the combine writing int8 activations (interpreter)
  python tools/dev/check_attention_kernels.py compile     compile them for sm_90 (Triton's bundled LLVM + ptxas)
                                                      at the model shapes (fp32 and bf16, blocks of 16/32),
                                                      and every launch config tools/dev/bench_attention.py
                                                      --sweep tries; prints shared memory, registers,
                                                      stack/local (spill) bytes, 16-byte cp.async, ld.v4 and
                                                      mma counts

Run with the Triton venv: /work/venv-triton/bin/python tools/dev/check_attention_kernels.py interpret
(134 checks, ~2 minutes on 2 cores; compile: 50 kernels, ~1 minute).
The interpreter patches (numpy buffers, bf16) are tools/dev/check_quant_kernels.py's.
"""

from __future__ import annotations

import math
import os
import re
import sys

import numpy as np

# (hq, hkv, dh): GQA groups 1, 4, 6, 8; a head size that is not a power of two (80: padded to 128 lanes)
INTERPRET_HEADS = [(2, 2, 64), (4, 1, 128), (12, 2, 128), (8, 1, 64), (4, 2, 80)]
COMPILE_HEADS = {
    "qwen2.5-1.5b": (12, 2, 128),
    "llama-3-8b": (32, 8, 128),
    "gemma3-270m": (4, 1, 256),
    "phi-like": (32, 32, 96),
}


def _buffer(array: np.ndarray):
    from ember.tools.dev.check_quant_kernels import HostBuffer

    return HostBuffer(array)


def make_case(
    rng: np.random.Generator,
    hq: int,
    hkv: int,
    dh: int,
    block_size: int,
    window: int,
    batch: int = 4,
    max_ctx: int = 100,
    padding_row: bool = False,
) -> dict:
    """Random pools, ragged contexts, scattered blocks. tables: what the reference reads (every block real);
    trimmed: a sliding kind's tables (block 0 where a block lies wholly before the window)."""
    width = -(-max_ctx // block_size) + 1  # one spare entry past the longest context
    ctx = rng.integers(1, max_ctx + 1, batch)
    ctx[0] = max_ctx
    blocks = 1 + rng.permutation(batch * width).reshape(batch, width)
    pools = [rng.standard_normal((1 + batch * width, block_size, hkv, dh)).astype(np.float32) for _ in range(2)]
    trimmed = blocks.copy()
    if window:
        for r in range(batch):
            dropped = max(0, ctx[r] - window) // block_size  # blocks wholly before position ctx - window + 1
            trimmed[r, :dropped] = 0
    if padding_row:  # what the runtime pads a bucket with: context 1, position 0, a table of block 0
        ctx[-1], blocks[-1], trimmed[-1] = 1, 0, 0
    q = rng.standard_normal((batch, hq, dh)).astype(np.float32)
    return dict(
        q=q,
        k_pool=pools[0],
        v_pool=pools[1],
        tables=blocks.astype(np.int32),
        trimmed=trimmed.astype(np.int32),
        ctx=ctx.astype(np.int32),
        window=window,
    )


def reference(case: dict, dtype, pool_dtype=None) -> np.ndarray:
    import jax.numpy as jnp

    from ember.compiler.ops.attention import _attend, _gather, _table_slots

    cast = lambda a, t=dtype: jnp.asarray(a.astype(t)).astype(jnp.float32)  # the same rounded inputs, fp32 math
    pools = (cast(case[name], pool_dtype or dtype) for name in ("k_pool", "v_pool"))
    slots = _table_slots(jnp.asarray(case["tables"]), case["k_pool"].shape[1])
    pos = jnp.asarray(case["ctx"] - 1)
    out = _attend(
        cast(case["q"])[:, None],
        *(_gather(pool, slots) for pool in pools),
        pos[:, None],
        jnp.int32(case["window"]),
        1.0 / math.sqrt(case["q"].shape[-1]),
    )
    return np.asarray(out[:, 0])


def run_kernel(
    case: dict, dtype, splits: int, block_n: int | None = None, nan_block0: bool = False, pool_dtype=None
) -> np.ndarray:
    """Launch the kernels the plan picks on host buffers: single when splits == 1, else partials then the combine
    kernel (checked against decode.combine_partials on the same partials). pool_dtype: the pools' (default q's;
    float8 e4m3: the kernels' fp16 dots)."""
    import jax.numpy as jnp

    from ember.compiler.ops.attention_gpu.decode import (
        DecodeAttentionConfig,
        combine_meta,
        combine_partials,
        decode_launch_plan,
    )
    from ember.compiler.ops.attention_gpu.decode_kernel import KERNELS

    q = case["q"].astype(dtype)
    batch, hq, dh = q.shape
    _, block_size, hkv, _ = case["k_pool"].shape
    k_pool, v_pool = (case[name].astype(pool_dtype or dtype) for name in ("k_pool", "v_pool"))
    tables = case["trimmed"] if nan_block0 else case["tables"]
    if nan_block0:
        k_pool[0], v_pool[0] = np.nan, np.nan
    config = DecodeAttentionConfig(block_n=block_n) if block_n else DecodeAttentionConfig()
    plan = decode_launch_plan(
        batch,
        hq,
        hkv,
        dh,
        block_size,
        tables.shape[1],
        dot_fp32=dtype == np.float32,
        scale=1.0 / math.sqrt(dh),
        config=config,
        splits=splits,
    )
    args = [
        _buffer(q),
        _buffer(k_pool),
        _buffer(v_pool),
        _buffer(tables),
        _buffer(case["ctx"]),
        _buffer(case["ctx"] - 1),
        _buffer(np.asarray([case["window"]], np.int32)),
    ]
    g = hq // hkv
    if plan["splits"] == 1:
        out = _buffer(np.full((batch, hq, dh), np.nan, dtype))
        KERNELS["single"][plan["grid"]](*args, out, **plan["meta"])
        return out.array.astype(np.float32)
    s = plan["splits"]
    outs = [
        _buffer(np.full(shape, np.nan, np.float32))
        for shape in ((batch, hkv, s, g, dh), (batch, hkv, s, g), (batch, hkv, s, g))
    ]
    KERNELS["partials"][plan["grid"]](*args, *outs, **plan["meta"])
    out = _buffer(np.full((batch, hq, dh), np.nan, dtype))
    KERNELS["combine"][(batch, hq)](*outs, out, **combine_meta(plan["meta"], s))
    merged = np.asarray(combine_partials(*(jnp.asarray(o.array) for o in outs), jnp.float32))
    got = out.array.astype(np.float32)
    # the combine kernel against the same merge in jnp: fp32 sums in another order, then the output dtype
    if not np.allclose(
        got, merged.astype(dtype).astype(np.float32), rtol=1e-2 if dtype != np.float32 else 1e-6, atol=1e-6
    ):
        raise AssertionError(f"combine kernel vs combine_partials: max diff {np.abs(got - merged).max():.3g}")
    return got


def _check_combine_quant(case: dict, order: str, splits: int = 5) -> tuple[bool, str]:
    """paged_decode_combine_quant_kernel on bf16 partials: its rows bit-equal to the plain combine kernel's, its
    int8 words equal to act_quant.quantize_activations of those rows, (dx, sx, s0, s1) to fp32 rounding."""
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.ops.attention_gpu.decode import combine_meta, decode_launch_plan
    from ember.compiler.ops.attention_gpu.decode_kernel import KERNELS
    from ember.compiler.ops.quant.act_quant import quantize_activations
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
        _buffer(q),
        _buffer(case["k_pool"].astype(dtype)),
        _buffer(case["v_pool"].astype(dtype)),
        _buffer(case["tables"]),
        _buffer(case["ctx"]),
        _buffer(case["ctx"] - 1),
        _buffer(np.asarray([0], np.int32)),
    ]
    g = hq // hkv
    parts = [
        _buffer(np.full(shape, np.nan, np.float32))
        for shape in ((batch, hkv, splits, g, dh), (batch, hkv, splits, g), (batch, hkv, splits, g))
    ]
    KERNELS["partials"][plan["grid"]](*args, *parts, **plan["meta"])
    meta = combine_meta(plan["meta"], splits)
    plain = _buffer(np.full((batch, hq, dh), np.nan, dtype))
    KERNELS["combine"][(batch, hq)](*parts, plain, **meta)
    out = _buffer(np.full((batch, hq, dh), np.nan, dtype))
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


def _check_rope_partials(case: dict, style: str, dtype, splits: int) -> tuple[bool, str]:
    """paged_decode_rope_partials_kernel against rope_write_kernel then paged_decode_partials_kernel on the same
    unrotated q / k / v: both pools bit-equal, the merged partials equal to fp32 rounding (the own token's score
    and V row are summed outside the dots). Each row writes its own token where its table puts position
    ctx - 1 (the padding row: block 0, as the runtime pads)."""
    import jax.numpy as jnp

    from ember.compiler.ops.attention_gpu.decode import combine_meta, combine_partials, decode_launch_plan
    from ember.compiler.ops.attention_gpu.decode_kernel import KERNELS
    from ember.compiler.ops.attention_gpu.rope_write import launch_plan as rope_plan
    from ember.compiler.ops.attention_gpu.rope_write import rope_write_kernel
    from ember.compiler.ops.rope import inv_frequencies

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
        [_buffer(case["tables"]), _buffer(case["ctx"]), _buffer(pos), _buffer(np.asarray([case["window"]], np.int32))],
    )
    partials = lambda: [
        _buffer(np.full(shape, np.nan, np.float32))
        for shape in ((batch, hkv, splits, g, dh), (batch, hkv, splits, g), (batch, hkv, splits, g))
    ]
    # two launches: rope_write (pools passed as input and aliased output, one buffer), then the partials
    pools_two = [_buffer(case[name].astype(dtype)) for name in ("k_pool", "v_pool")]
    q_rot = _buffer(np.zeros_like(q))
    rplan = rope_plan(batch, hq, hkv, dh, style)
    rope_write_kernel[rplan["grid"]](
        _buffer(q),
        _buffer(k),
        _buffer(v),
        _buffer(pos),
        _buffer(inv_freq),
        _buffer(slots),
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
            _buffer(q),
            _buffer(k),
            _buffer(v),
            _buffer(inv_freq),
            _buffer(slots),
            *pools,
            *shared,
            *outs,
            *pools,
            INTERLEAVED=style == "interleaved",
            WRITE_KV=write_kv,
            **plan["meta"],
        )
        return outs

    pools_one = [_buffer(case[name].astype(dtype)) for name in ("k_pool", "v_pool")]
    got = one_launch(pools_one)
    same = lambda a, b: np.array_equal(a.array.astype(np.float32), b.array.astype(np.float32), equal_nan=True)
    merged = lambda parts: np.asarray(combine_partials(*(jnp.asarray(p.array) for p in parts), jnp.float32))
    reference = merged(want)
    close = lambda parts: float(np.abs(merged(parts) - reference).max() / np.abs(reference).max())  # NaN: fails
    err = close(got)
    # the combine kernel over them too: the empty splits' acc and l stay NaN (unwritten) and must not leak in
    combined = _buffer(np.full((batch, hq, dh), np.nan, np.float32))
    KERNELS["combine"][(batch, hq)](*got, combined, **combine_meta(plan["meta"], splits))
    combined_err = float(np.abs(combined.array - reference).max() / np.abs(reference).max())
    err = err if combined_err <= err else combined_err  # NaN propagates (max() would drop it)
    pools_equal = all(same(a, b) for a, b in zip(pools_one, pools_two))
    # the own token from registers: pools whose written slots hold NaN, left unwritten (WRITE_KV=False)
    stale = [case[name].astype(dtype) for name in ("k_pool", "v_pool")]
    for pool in stale:
        pool.reshape(-1, *pool.shape[2:])[slots] = np.nan
    own_err = close(one_launch([_buffer(pool) for pool in stale], write_kv=False))
    return not (err < 1e-5 and own_err < 1e-5 and pools_equal), (
        f"rel_err={err:.1e} pools equal={pools_equal} own token unwritten rel_err={own_err:.1e}"
    )


def interpret() -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
    from ember.tools.dev.check_quant_kernels import patch_interpreter

    patch_interpreter()
    import ml_dtypes

    rng = np.random.default_rng(0)
    failures = checks = 0
    for hq, hkv, dh in INTERPRET_HEADS:
        for block_size, window in ((16, 0), (32, 0), (16, 5), (32, 37)):
            case = make_case(rng, hq, hkv, dh, block_size, window, padding_row=not window)
            for dtype in (np.float32, ml_dtypes.bfloat16):
                expected = reference(case, dtype)
                for splits, block_n in ((1, None), (3, 16), (8, 32)):
                    got = run_kernel(case, dtype, splits, block_n, nan_block0=bool(window))
                    err = float(np.abs(got - expected).max() / np.abs(expected).max())
                    tol = 1e-5 if dtype == np.float32 else 2e-2
                    bad = not err < tol  # NaN fails too
                    failures += bad
                    checks += 1
                    print(
                        f"{'BAD' if bad else 'ok '} hq={hq:<2} hkv={hkv} dh={dh:<3} bs={block_size} "
                        f"window={window:<2} "
                        f"{np.dtype(dtype).name:8} splits={splits} block_n={block_n or 64:<3} "
                        f"{'NaN block 0 ' if window else ''}rel_err={err:.1e}",
                        flush=True,
                    )
    for hq, hkv, dh in ((12, 2, 128), (8, 1, 64)):  # FP8 (e4m3) pools under bf16 q: the fp16 dots
        case = make_case(rng, hq, hkv, dh, 16, 0, max_ctx=300, padding_row=True)
        expected = reference(case, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn)
        for splits in (1, 3):
            got = run_kernel(case, ml_dtypes.bfloat16, splits, 32, pool_dtype=ml_dtypes.float8_e4m3fn)
            err = float(np.abs(got - expected).max() / np.abs(expected).max())
            failures += not err < 4e-3  # the bf16 output's rounding; the same rows on bf16 pools differ by 2-3e-2
            checks += 1
            print(
                f"{'ok ' if err < 4e-3 else 'BAD'} hq={hq:<2} hkv={hkv} dh={dh:<3} bs=16 bf16 q, float8_e4m3fn pools "
                f"splits={splits} rel_err={err:.1e}",
                flush=True,
            )
    # more splits than one combine tile holds (32): long rows beside short ones, 40 splits
    case = make_case(rng, 12, 2, 64, 16, 0, max_ctx=1200, padding_row=True)
    for dtype in (np.float32, ml_dtypes.bfloat16):
        expected = reference(case, dtype)
        err = float(np.abs(run_kernel(case, dtype, 40, 16) - expected).max() / np.abs(expected).max())
        bad = not err < (1e-5 if dtype == np.float32 else 2e-2)
        failures += bad
        checks += 1
        print(
            f"{'BAD' if bad else 'ok '} hq=12 hkv=2 dh=64  bs=16 ctx<=1200 {np.dtype(dtype).name:8} splits=40 "
            f"block_n=16 rel_err={err:.1e}",
            flush=True,
        )
    bad, done = interpret_combine_quant(rng)
    failures, checks = failures + bad, checks + done
    for (hq, hkv, dh), style, dtype_name, splits in (
        ((12, 2, 128), "neox", "bfloat16", 5),
        ((8, 1, 64), "interleaved", "float32", 3),
        ((4, 2, 64), "neox", "float32", 8),
        ((12, 2, 128), "neox", "float32", 2),
    ):
        case = make_case(rng, hq, hkv, dh, 16, 0 if splits != 3 else 21, max_ctx=200, padding_row=True)
        dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
        bad, note = _check_rope_partials(case, style, dtype, splits)
        failures += bad
        checks += 1
        print(
            f"{'BAD' if bad else 'ok '} RoPE + write + partials hq={hq:<2} hkv={hkv} dh={dh:<3} {style:11} "
            f"{dtype_name:8} splits={splits} {note}",
            flush=True,
        )
    print(f"{checks - failures}/{checks} passed")
    return 1 if failures else 0


def interpret_combine_quant(rng=None) -> tuple[int, int]:
    """The combine writing the int8 activations too (quant_gemv.act_terms terms): (failures, checks)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    failures = checks = 0
    for hq, hkv, dh in ((12, 2, 128), (8, 1, 64)):
        case = make_case(rng, hq, hkv, dh, 16, 0, max_ctx=300, padding_row=True)
        for order in ("q4_k", "q6_k"):
            bad, note = _check_combine_quant(case, order)
            failures += bad
            checks += 1
            print(
                f"{'BAD' if bad else 'ok '} combine + int8 hq={hq:<2} hkv={hkv} dh={dh:<3} {order} {note}", flush=True
            )
    return failures, checks


def _resource_usage(cubin: bytes) -> str:
    """Registers, stack and local (spill) bytes per thread, from the cuobjdump bundled with Triton."""
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        try:
            text = subprocess.run([tool, "-res-usage", file.name], capture_output=True, text=True).stdout
        except OSError:
            return "regs=? stack=? local=?"
    found = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text))
    return f"regs={found.get('REG', '?'):>3} stack={found.get('STACK', '?')} local={found.get('LOCAL', '?')}"


def compile_all() -> int:
    from ember.compiler.ops.attention_gpu.decode import DecodeAttentionConfig
    from ember.tools.dev.bench_attention import SWEEP_CONFIGS

    failures = 0
    for model, heads in COMPILE_HEADS.items():  # the default launch config at every shape and dtype
        for dtype in ("bf16", "fp32"):
            for block_size in (16, 32):
                for kind in ("single", "partials", "combine", "combine_quant", "rope_partials"):
                    if kind in ("combine_quant", "rope_partials") and (dtype != "bf16" or heads[2] & (heads[2] - 1)):
                        continue  # bf16 rows of power-of-two heads (the int8 activations; RoPE's pairs)
                    failures += _compile_one(model, heads, dtype, block_size, kind, DecodeAttentionConfig())
    for config in SWEEP_CONFIGS:  # what tools/dev/bench_attention.py --sweep launches
        failures += _compile_one("qwen2.5-1.5b", COMPILE_HEADS["qwen2.5-1.5b"], "bf16", 16, "partials", config)
    return 1 if failures else 0


def _compile_one(model: str, heads: tuple[int, int, int], dtype: str, block_size: int, kind: str, config) -> int:
    from ember.compiler.ops.attention_gpu.decode import combine_meta, decode_launch_plan
    from ember.compiler.ops.attention_gpu.decode_kernel import KERNELS
    from ember.tools.dev.check_quant_kernels import compile_sm90

    hq, hkv, dh = heads
    plan = decode_launch_plan(
        1,
        hq,
        hkv,
        dh,
        block_size,
        32768 // block_size,
        dot_fp32=dtype == "fp32",
        scale=dh**-0.5,
        config=config,
        splits=None if kind == "combine" else 1 if kind == "single" else 4,
    )
    kernel = KERNELS[kind]
    if kind == "combine":  # the partials (fp32) of the plan's own split count -> out
        types = ["*fp32"] * 3 + ["*" + dtype]
        plan["meta"] = combine_meta(plan["meta"], plan["splits"])
    elif kind == "combine_quant":  # -> out, qa, da (packed for Q6_K: the permuted order)
        types = ["*fp32"] * 3 + ["*" + dtype, "*i32", "*fp32"]
        plan["meta"] = {**combine_meta(plan["meta"], plan["splits"]), "Q6": True, "ASM": True}
    elif kind == "rope_partials":  # q, k, v, inv_freq, slots, pools, table / ctx / pos / window -> partials, pools
        types = (
            ["*" + dtype] * 3 + ["*fp32", "*i32"] + ["*" + dtype] * 2 + ["*i32"] * 4 + ["*fp32"] * 3 + ["*" + dtype] * 2
        )
        plan["meta"] = {**plan["meta"], "INTERLEAVED": False, "WRITE_KV": True}
    else:
        outs = [dtype] if kind == "single" else ["fp32"] * 3
        types = ["*" + dtype] * 3 + ["*i32"] * 4 + ["*" + t for t in outs]
    label = (
        f"{model:13} {dtype} bs={block_size} {kind:8} block_n={plan['block_n']:<3} "
        f"warps={config.num_warps} stages={config.num_stages}"
    )
    try:
        compiled = compile_sm90(
            kernel, types, dict(plan["meta"]), num_warps=config.num_warps, num_stages=config.num_stages
        )
    except Exception as error:
        print(f"FAIL {label}: {error}", flush=True)
        return 1
    ptx = compiled.asm["ptx"]
    print(
        f"ok  {label} smem={compiled.metadata.shared:>6} {_resource_usage(compiled.asm['cubin'])} "
        f"ld.v4={ptx.count('ld.global.v4')} cp.async.16B={ptx.count('], 0x10')} mma={ptx.count('mma.sync')}",
        flush=True,
    )
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("interpret", "compile", "combine-quant"):
        print(__doc__)
        return 2
    if (
        argv[0] == "combine-quant"
    ):  # only the combine that writes int8 activations (e.g. --policy quant_gemv.act_terms=2)
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
        from ember.tools.dev.check_quant_kernels import patch_interpreter

        patch_interpreter()
        return 1 if interpret_combine_quant()[0] else 0
    return interpret() if argv[0] == "interpret" else compile_all()


if __name__ == "__main__":
    from ember.tools.dev.policy_flag import run_with_policy

    sys.exit(run_with_policy(main, sys.argv[1:]))
