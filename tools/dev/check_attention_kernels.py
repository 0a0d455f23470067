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
The interpreter patches (numpy buffers, bf16) are tools/dev/check_quant_kernels.py's. The cases, reference and
plain launches: check_attention_cases.py; the fused kernels' checks: check_attention_fused.py; compile:
check_attention_compile.py.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from ember.tools.dev.check_attention_cases import make_case, reference, run_kernel
from ember.tools.dev.check_attention_compile import compile_all
from ember.tools.dev.check_attention_fused import check_combine_quant, check_rope_partials

# (hq, hkv, dh): GQA groups 1, 4, 6, 8; a head size that is not a power of two (80: padded to 128 lanes)
INTERPRET_HEADS = [(2, 2, 64), (4, 1, 128), (12, 2, 128), (8, 1, 64), (4, 2, 80)]


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
        bad, note = check_rope_partials(case, style, dtype, splits)
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
            bad, note = check_combine_quant(case, order)
            failures += bad
            checks += 1
            print(
                f"{'BAD' if bad else 'ok '} combine + int8 hq={hq:<2} hkv={hkv} dh={dh:<3} {order} {note}", flush=True
            )
    return failures, checks


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
