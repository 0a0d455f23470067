"""Check the integer-dot Q4_K / Q6_K GEMV (compiler/kernels/gguf_gemv/dp4a_kernel.py) without a GPU.

  python tools/dev/check_dp4a_kernels.py interpret   Triton's CPU interpreter (dp4a emulated with shifts and
                                                 multiplies, ASM=False) against act_quant.dp4a_matmul_ref (the
                                                 GEMV, and its parts kernel writing q / k / v apart with their
                                                 bias), and the activation quantizer (gguf_gemv/act_quant_kernel.py)
                                                 against jnp
  python tools/dev/check_dp4a_kernels.py compile     compile for sm_90 at the engine's Q4_K decode shapes
                                                 (ASM=True): registers, spills, dp4a count from ptxas -v / PTX
Both for Q4_K and Q6_K (the format decides the activation packing and the kernel's Q6 constexpr).
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np

from ember.compiler.kernels.gguf_gemv.act_quant import FACTORS
from ember.tools.dev.check_quant_kernels import PLANE_TYPES, HostBuffer, compile_sm90, patch_interpreter, ptxas_usage

# (out, in), (block_n, split_k, sb_per_step, prefetch), activation rows. Together: R = 1..8 and two groups
# (m = 11: 2 x 6, one padding row), split-K with a short last split, masked row tiles (out not a multiple
# of block_n), a last step partly outside the split (not EXACT), EXACT, PREFETCH off, one super-block.
CASES = [
    ((40, 1536), (16, 1, 4, True), [1, 3]),
    ((40, 1536), (8, 4, 1, True), [2, 8]),
    ((20, 1280), (4, 2, 2, True), [1, 5]),
    ((24, 1280), (16, 1, 2, False), [4]),
    ((12, 256), (8, 3, 2, True), [7]),
    ((44, 2048), (16, 2, 2, True), [1, 11]),  # EXACT: 2 splits of 2 steps
]


def _compared(got: np.ndarray, expected: np.ndarray, label: str) -> bool:
    """Print one case's line; True when it failed (relative error >= 1e-5, or NaN: an unwritten element)."""
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    bad = not err < 1e-5
    print(f"{'BAD' if bad else 'ok '} {label} rel_err={err:.1e}", flush=True)
    return bad


def interpret() -> int:
    import jax.numpy as jnp

    from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig, launch_plan, pack, random_gguf_bytes
    from ember.compiler.kernels.gguf_gemv.act_quant import dp4a_matmul_ref, quantize_activations
    from ember.compiler.kernels.gguf_gemv.dp4a import pad_rows
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import DP4A_PLANES, dp4a_gemv_kernel

    failures = 0
    rng = np.random.default_rng(3)
    # (weight format, activation packing): a Q6_K weight also reads Q4_K-packed words (ACT_Q4)
    for fmt, order in (("q4_k", "q4_k"), ("q6_k", "q6_k"), ("q6_k", "q4_k")):
        for (out, inner), (block_n, split_k, sb, prefetch), ms in CASES:
            w = pack(random_gguf_bytes(rng, fmt, (out, inner), realistic=True), fmt, (out, inner))
            config = QuantMatmulConfig(
                variant="dp4a", block_n=block_n, split_k=split_k, sb_per_step=sb, prefetch=prefetch
            )
            for m in ms:
                x = rng.standard_normal((m, inner)).astype(np.float32)
                x[0, :32] = 0.0  # an all-zero activation block (dx = 0)
                expected = np.asarray(dp4a_matmul_ref(jnp.asarray(x), w))
                plan = launch_plan(fmt, m, out, inner, config)
                meta = dict(plan["meta"], ASM=False, ACT_Q4=order != fmt)
                qa, da = (np.asarray(a) for a in pad_rows(*quantize_activations(jnp.asarray(x), order), meta["M_PAD"]))
                meta["TERMS"] = da.shape[-1] // FACTORS
                y = HostBuffer(np.full((plan["split_k"], meta["M_PAD"], out), np.nan, np.float32))
                dp4a_gemv_kernel[plan["grid"]](
                    HostBuffer(qa), HostBuffer(da), *(HostBuffer(w.planes[n]) for n in DP4A_PLANES[fmt]), y, **meta
                )
                failures += _compared(
                    y.array.sum(axis=0)[:m],
                    expected,
                    f"dp4a {fmt} (activations {order}) {out}x{inner} m={m:<2} R={meta['R']} block_n={block_n} "
                    f"grid={plan['grid']} S={meta['S']} exact={meta['EXACT']} prefetch={meta['PREFETCH']}",
                )
    return 1 if failures else 0


# (sizes of the packed projections, bias offset or None, dp4a config, rows): 3, 2 and 1 parts, parts that
# split a row tile, a bias read at an offset (a group's later part), two row groups
PARTS_CASES = [
    ((24, 8, 8), 0, (8, 1, 2, True), [1, 3]),
    ((28, 12), 5, (16, 1, 4, True), [2]),
    ((16, 16, 8), None, (8, 1, 2, False), [11]),
    ((24,), 7, (8, 1, 2, True), [1]),
]


def interpret_parts() -> int:
    """dp4a_gemv_parts_kernel against act_quant.dp4a_matmul_ref + the bias, split into the projections."""
    import jax.numpy as jnp

    from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig, launch_plan, pack, random_gguf_bytes
    from ember.compiler.kernels.gguf_gemv.act_quant import dp4a_matmul_ref, quantize_activations
    from ember.compiler.kernels.gguf_gemv.dp4a import pad_rows, parts_plan
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import DP4A_PLANES, dp4a_gemv_parts_kernel

    failures, inner = 0, 1536
    rng = np.random.default_rng(6)
    for fmt, (sizes, offset, (block_n, split_k, sb, prefetch), ms) in itertools.product(("q4_k", "q6_k"), PARTS_CASES):
        out = sum(sizes)
        w = pack(random_gguf_bytes(rng, fmt, (out, inner), realistic=True), fmt, (out, inner))
        bias = None if offset is None else rng.standard_normal(offset + out + 3).astype(np.float32)
        config = QuantMatmulConfig(variant="dp4a", block_n=block_n, split_k=split_k, sb_per_step=sb, prefetch=prefetch)
        for m in ms:
            x = rng.standard_normal((m, inner)).astype(np.float32)
            expected = np.asarray(dp4a_matmul_ref(jnp.asarray(x), w))
            if bias is not None:
                expected = expected + bias[offset : offset + out]
            plan = launch_plan(fmt, m, out, inner, config)
            meta = dict(
                plan["meta"],
                ASM=False,
                HAS_BIAS=bias is not None,
                BIAS_OFFSET=offset or 0,
                **parts_plan(plan, sizes, out),
            )
            qa, da = (np.asarray(a) for a in pad_rows(*quantize_activations(jnp.asarray(x), fmt), meta["M_PAD"]))
            meta["TERMS"] = da.shape[-1] // FACTORS
            widths = (*sizes, 1, 1)[:3]
            outs = [HostBuffer(np.full((meta["M_PAD"], width), np.nan, np.float32)) for width in widths]
            dp4a_gemv_parts_kernel[plan["grid"]](
                HostBuffer(qa),
                HostBuffer(da),
                *(HostBuffer(w.planes[n]) for n in DP4A_PLANES[fmt]),
                HostBuffer(np.zeros(1, np.float32) if bias is None else bias),
                *outs,
                **meta,
            )
            failures += _compared(
                np.concatenate([o.array[:m] for o in outs[: len(sizes)]], axis=1),
                expected,
                f"dp4a parts {fmt} sizes={sizes} bias_offset={offset} m={m} R={meta['R']} block_n={block_n}",
            )
    return 1 if failures else 0


def interpret_pair() -> int:
    """dp4a_gemv_pair_kernel (a Q4_K part of one or two projections, then a Q6_K or Q4_K part of one, one
    launch reading Q4_K-packed activations) against act_quant.dp4a_matmul_ref of each part plus the bias."""
    import jax.numpy as jnp

    from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig, launch_plan, pack, random_gguf_bytes
    from ember.compiler.kernels.gguf_gemv.act_quant import dp4a_matmul_ref, quantize_activations
    from ember.compiler.kernels.gguf_gemv.dp4a import pad_rows
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import DP4A_PLANES, dp4a_gemv_pair_kernel

    failures, inner = 0, 1536
    rng = np.random.default_rng(8)
    # (A's projections, B's format and rows, A's and B's (block_n, sb_per_step), activation rows)
    for run_a, (fmt_b, out_b), tiles, ms in (
        ((24, 8), ("q6_k", 8), ((8, 2), (4, 4)), [1, 3]),
        ((20,), ("q4_k", 12), ((16, 4), (8, 1)), [2, 11]),
    ):
        out_a = sum(run_a)
        wa = pack(random_gguf_bytes(rng, "q4_k", (out_a, inner), realistic=True), "q4_k", (out_a, inner))
        wb = pack(random_gguf_bytes(rng, fmt_b, (out_b, inner), realistic=True), fmt_b, (out_b, inner))
        bias = rng.standard_normal(out_a + out_b).astype(np.float32)
        for m in ms:
            x = rng.standard_normal((m, inner)).astype(np.float32)
            expected = np.concatenate([np.asarray(dp4a_matmul_ref(jnp.asarray(x), w)) for w in (wa, wb)], axis=1)
            expected = expected + bias
            (pa, pb) = (
                launch_plan(f, m, o, inner, QuantMatmulConfig(variant="dp4a", block_n=bn, sb_per_step=sb))
                for f, o, (bn, sb) in (("q4_k", out_a, tiles[0]), (fmt_b, out_b, tiles[1]))
            )
            ma, mb = pa["meta"], pb["meta"]
            qa, da = (np.asarray(a) for a in pad_rows(*quantize_activations(jnp.asarray(x), "q4_k"), ma["M_PAD"]))
            widths = (run_a[0], run_a[1] if len(run_a) == 2 else 1, out_b)
            outs = [HostBuffer(np.full((ma["M_PAD"], width), np.nan, np.float32)) for width in widths]
            dp4a_gemv_pair_kernel[(pa["grid"][0] + pb["grid"][0], 1, 1)](
                HostBuffer(qa),
                HostBuffer(da),
                *(HostBuffer(wa.planes[n]) for n in DP4A_PLANES["q4_k"]),
                *(HostBuffer(wb.planes[n]) for n in DP4A_PLANES[fmt_b]),
                HostBuffer(bias),
                *outs,
                M_PAD=ma["M_PAD"],
                K=inner,
                R=ma["R"],
                NA=out_a,
                N1=run_a[0],
                NB=out_b,
                TILES_A=pa["grid"][0] // (ma["M_PAD"] // ma["R"]),
                BLOCK_N_A=ma["BLOCK_N"],
                S_A=ma["S"],
                PREFETCH_A=ma["PREFETCH"],
                EXACT_A=ma["EXACT"],
                BLOCK_N_B=mb["BLOCK_N"],
                S_B=mb["S"],
                PREFETCH_B=mb["PREFETCH"],
                EXACT_B=mb["EXACT"],
                Q6_B=fmt_b == "q6_k",
                ASM=False,
                HAS_BIAS=True,
                BIAS_OFFSET=0,
                TERMS=da.shape[-1] // FACTORS,
            )
            kept = [outs[0].array[:m]] + ([outs[1].array[:m]] if len(run_a) == 2 else []) + [outs[2].array[:m]]
            failures += _compared(
                np.concatenate(kept, axis=1), expected, f"dp4a pair q4_k {run_a} + {fmt_b} ({out_b},) m={m} R={ma['R']}"
            )
    return 1 if failures else 0


def activation_buffers(m: int, k: int):
    """Host buffers for x [m, k]'s int8 activations as the producers write them (act_quant.packed_shapes)."""
    from ember.compiler.kernels.gguf_gemv.act_quant import packed_shapes
    from ember.tools.dev.check_quant_kernels import HostBuffer

    qa, da = packed_shapes(m, k)
    return HostBuffer(np.zeros(qa.shape, np.int32)), HostBuffer(np.full(da.shape, np.nan, np.float32))


def compare_activations(
    qa: np.ndarray,
    da: np.ndarray,
    qa_ref: np.ndarray,
    da_ref: np.ndarray,
    *,
    tol: float = 1e-5,
    code_slack: int = 0,
    min_same: float = 1.0,
) -> tuple[bool, str]:
    """A producer's int8 activations (qa [m, T k/4], da [m, k/32, 4 T]) against act_quant.quantize_activations':
    (failed, note). The first term: its codes within code_slack of the reference's (min_same of its words
    equal) and its (dx, sx, s0, s1) within tol of the largest. A second term rounds the first one's residual,
    so a last-bit difference in dx (the reference's division) may move one of its codes by one: its codes
    within one, at most 0.1% of its words (or two) unequal, dx' within 1e-3 and its code sums within 2."""
    terms = da.shape[-1] // FACTORS
    words = qa.shape[1] // terms
    codes = lambda a: a.view(np.int8).astype(np.int32)  # noqa: E731
    first, first_ref = qa[:, :words], qa_ref[:, :words]
    same = float((first == first_ref).mean())
    code_diff = int(np.abs(codes(first) - codes(first_ref)).max())
    err = float(np.abs(da[..., :FACTORS] - da_ref[..., :FACTORS]).max() / np.abs(da_ref[..., :FACTORS]).max())
    failed = not (code_diff <= code_slack and same >= min_same and err < tol)
    note = f"words equal {same:.4f} max code diff {code_diff} (dx, sx, s0, s1) rel_err={err:.1e}"
    if terms > 1:
        second, second_ref = qa[:, words:], qa_ref[:, words:]
        unequal = int((second != second_ref).sum())
        diff2 = int(np.abs(codes(second) - codes(second_ref)).max())
        dx_err = float(np.abs(da[..., 4] - da_ref[..., 4]).max() / max(np.abs(da_ref[..., 4]).max(), 1e-30))
        sums = float(np.abs(da[..., 6:] - da_ref[..., 6:]).max())
        failed = failed or not (diff2 <= 1 and unequal <= max(2, second.size // 1000) and dx_err < 1e-3 and sums <= 2)
        note += (
            f"; second term: {unequal} of {second.size} words unequal, max code diff {diff2}, dx' rel_err={dx_err:.1e}"
        )
    return failed, note


def interpret_quantize() -> int:
    """gguf_gemv/act_quant_kernel.py's kernel against act_quant.quantize_activations: packed words equal, (dx, sx) close
    (and the SILU_GATED variant); the number of failed cases."""
    import jax.numpy as jnp

    from ember.compiler.kernels.gguf_gemv.act_quant import quantize_activations
    from ember.compiler.kernels.gguf_gemv.act_quant_kernel import quantize_plan, quantize_rows_kernel

    failures = 0
    rng = np.random.default_rng(4)
    for (m, k, scale), order in itertools.product(
        ((1, 1536, 1.0), (3, 8960, 30.0), (2, 544, 1e-3)),  # 544: a
        ("q4_k", "q6_k"),
    ):  # masked program
        x = (rng.standard_normal((m, k)) * scale).astype(np.float32)
        x[0, 64:96] = 0.0
        x[-1, :32] = np.arange(32) - 15.5  # with max |x| = 127 (inv = 1) these are ties: rounded to even
        x[-1, 0] = 127.0
        qa_ref, da_ref = (np.asarray(a) for a in quantize_activations(jnp.asarray(x), order))
        plan = quantize_plan(m, k, order)
        qa, da = activation_buffers(m, k)
        quantize_rows_kernel[plan["grid"]](HostBuffer(x), qa, da, ASM=False, **plan["meta"])
        bad, note = compare_activations(qa.array, da.array, qa_ref, da_ref, tol=1e-6)
        failures += bad
        print(f"{'BAD' if bad else 'ok '} quantize {order} m={m} k={k} {note}", flush=True)
    return failures + interpret_quantize_gated()


def interpret_quantize_gated() -> int:
    """SILU_GATED: the quantizer reads a gate/up output [m, 2k] and quantizes silu(gate) * up; against jnp's
    activation then quantize_activations (sigmoid's last-bit differences may move a rare code by one)."""
    import jax.numpy as jnp

    from ember.compiler.kernels.activation import gated_act_packed
    from ember.compiler.kernels.gguf_gemv.act_quant import quantize_activations
    from ember.compiler.kernels.gguf_gemv.act_quant_kernel import quantize_plan, quantize_rows_kernel

    failures = 0
    rng = np.random.default_rng(5)
    for (m, k), order in itertools.product(((1, 1536), (2, 8960)), ("q4_k", "q6_k")):
        gate_up = (rng.standard_normal((m, 2 * k)) * 3.0).astype(np.float32)
        qa_ref, da_ref = (
            np.asarray(a) for a in quantize_activations(gated_act_packed(jnp.asarray(gate_up), act="silu"), order)
        )
        plan = quantize_plan(m, k, order, silu_gated=True)
        qa, da = activation_buffers(m, k)
        quantize_rows_kernel[plan["grid"]](HostBuffer(gate_up), qa, da, ASM=False, **plan["meta"])
        bad, note = compare_activations(qa.array, da.array, qa_ref, da_ref, code_slack=1, min_same=0.99)
        failures += bad
        print(f"{'BAD' if bad else 'ok '} quantize silu-gated {order} m={m} k={k} {note}", flush=True)
    return failures


def compile_all() -> int:
    from ember.compiler.kernels.gguf_gemv import launch_plan, pick_config
    from ember.compiler.kernels.gguf_gemv.dp4a_kernel import dp4a_gemv_kernel
    from ember.tools.dev.bench_quant_matmul import DECODE_SHAPES

    failures = 0
    for fmt in ("q4_k", "q6_k"):
        for m in (1, 4, 8):
            for out, inner in DECODE_SHAPES[fmt]:
                config = pick_config(fmt, m, out, inner)
                if config.variant != "dp4a":
                    continue
                plan = launch_plan(fmt, m, out, inner, config)
                out_dtype = "bf16" if plan["split_k"] == 1 else "fp32"
                types = ["*i32", "*fp32", *PLANE_TYPES[fmt], "*" + out_dtype]
                label = (
                    f"{fmt} m={m} {out:>6}x{inner:<5} bn={config.block_n:<2} split={plan['split_k']} "
                    f"S={plan['meta']['S']:<2} warps={config.num_warps}"
                )
                try:
                    compiled = compile_sm90(
                        dp4a_gemv_kernel, types, plan["meta"], num_warps=config.num_warps, num_stages=config.num_stages
                    )
                except Exception as error:
                    failures += 1
                    print(f"FAIL {label}: {error}", flush=True)
                    continue
                ptx = compiled.asm["ptx"]
                print(
                    f"ok  {label} {ptxas_usage(ptx)} smem={compiled.metadata.shared} dp4a={ptx.count('dp4a')} "
                    f"ld.v4={ptx.count('ld.global.v4')}",
                    flush=True,
                )
    from ember.compiler.kernels.gguf_gemv.act_quant_kernel import quantize_plan, quantize_rows_kernel

    for k in (1536, 8960):
        compiled = compile_sm90(
            quantize_rows_kernel,
            ["*bf16", "*i32", "*fp32"],
            dict(quantize_plan(1, k, "q6_k")["meta"], ASM=True),
            num_warps=4,
            num_stages=1,
        )
        ptx = compiled.asm["ptx"]
        print(
            f"ok  quantize k={k} {ptxas_usage(ptx)} smem={compiled.metadata.shared} "
            f"cvt.rni={ptx.count('cvt.rni.s32.f32')}",
            flush=True,
        )
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["interpret"]:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
        patch_interpreter()
        return min(1, interpret_quantize()) | interpret() | interpret_parts() | interpret_pair()
    if argv[:1] == ["compile"]:
        return compile_all()
    print(__doc__)
    return 2


if __name__ == "__main__":
    from ember.tools.dev.policy_flag import run_with_policy

    sys.exit(run_with_policy(main, sys.argv[1:]))
