"""Check the RMSNorm kernels (compiler/kernels/norm/kernel.py) without a GPU (needs only triton==3.6.0).

  python -m ember.tools.dev.check_norm_kernels interpret   run both kernels in Triton's CPU interpreter against
                                                       norm.py's references: CASES; then norm/quant_kernel.py's
                                                       (the norms writing a GEMV's int8 activations too)
The interpreter patches (numpy buffers, bf16 through fp32) are tools/dev/check_quant_kernels.py's, plus fp32 -> bf16
rounding to nearest even (the interpreter truncates; the GPU rounds), so the residual sum can be compared exactly.
"""

from __future__ import annotations

import os
import sys

import numpy as np

# (rows, n, dtype name, eps): n a power of two and not (a masked tile), one row and several, bf16 and f32,
# the hidden sizes of the benchmark shapes (1536, 4096)
CASES = [
    (1, 1536, "bfloat16", 1e-6),
    (3, 4096, "bfloat16", 1e-5),
    (5, 96, "float32", 1e-6),
    (2, 1536, "float32", 1e-5),
    (7, 40, "bfloat16", 1e-6),
]


def patch_interpreter_rne() -> None:
    """check_quant_kernels' interpreter patches, plus fp32 -> bf16 rounding to nearest even: the interpreter
    rounds toward zero; the GPU (and the reference) round to nearest even. Likewise to float8 e4m3 (an FP8 KV
    pool's writes), where the interpreter rounds ties away from zero and flushes small values: here to nearest
    even, saturating at +-448 as the GPU's cvt ... satfinite. Call before importing kernels."""
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
    from ember.tools.dev.check_quant_kernels import patch_interpreter

    patch_interpreter()
    import ml_dtypes
    import triton.language as tl
    import triton.runtime.interpreter as ti

    builder = ti.InterpreterBuilder
    cast, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def cast_rne(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return ti.TensorHandle(src.data.astype(ml_dtypes.bfloat16).view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    def fp_to_fp_rne(self, src, dst_type, rounding_mode):
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar in (tl.float32, tl.bfloat16):
            values = src.data.view(ml_dtypes.bfloat16) if src.dtype.scalar == tl.bfloat16 else src.data
            values = np.clip(values.astype(np.float32), -448.0, 448.0)
            return ti.TensorHandle(values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), tl.float8e4nv)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    builder.cast_impl = cast_rne
    builder.create_fp_to_fp = fp_to_fp_rne


def interpret() -> int:
    patch_interpreter_rne()
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.norm import reference as norm
    from ember.compiler.kernels.norm.kernel import add_rms_norm_kernel, launch_plan, rms_norm_kernel
    from ember.tools.dev.check_quant_kernels import HostBuffer

    failures = 0
    rng = np.random.default_rng(0)
    for rows, n, dtype_name, eps in CASES:
        dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
        x = (rng.standard_normal((rows, n)) * rng.uniform(0.1, 4.0, (rows, 1))).astype(dtype)
        y = rng.standard_normal((rows, n)).astype(dtype)
        w = rng.uniform(0.5, 1.5, n).astype(dtype)
        plan = launch_plan(rows, n)
        want_s, want = (
            np.asarray(a).astype(np.float32)
            for a in norm.add_rms_norm(jnp.asarray(x), jnp.asarray(y), jnp.asarray(w), eps=eps)
        )
        want_alone = np.asarray(norm.rms_norm(jnp.asarray(x), jnp.asarray(w), eps=eps)).astype(np.float32)
        s, out, alone = (HostBuffer(np.zeros((rows, n), dtype)) for _ in range(3))
        add_rms_norm_kernel[plan["grid"]](HostBuffer(x), HostBuffer(y), HostBuffer(w), s, out, EPS=eps, **plan["meta"])
        rms_norm_kernel[plan["grid"]](HostBuffer(x), HostBuffer(w), alone, EPS=eps, **plan["meta"])
        # the sum is rounded as the reference rounds it: equal; the norm within one rounding of the dtype
        tol = 1e-5 if dtype_name == "float32" else 2**-7
        sum_ok = np.array_equal(s.array.astype(np.float32), want_s)
        errs = [
            float(np.max(np.abs(got.array.astype(np.float32) - ref) / (np.abs(ref) + 1e-3)))
            for got, ref in ((out, want), (alone, want_alone))
        ]
        bad = not sum_ok or max(errs) > tol
        failures += bad
        print(
            f"{'BAD' if bad else 'ok '} rows={rows} n={n} {dtype_name:8} sum_equal={sum_ok} "
            f"rel_err add_rms_norm={errs[0]:.1e} rms_norm={errs[1]:.1e}",
            flush=True,
        )
    return 1 if failures else 0


def interpret_quantized() -> int:
    """norm/quant_kernel.py's kernels: their normed rows (and sum) bit-equal to norm/kernel.py's kernels', their
    int8 activations equal to act_quant.quantize_activations of those rows (words equal, (dx, sx) close).
    "partials": the residual operand given as fp32 split-K partials [splits, rows_pad, n], which must equal
    the plain kernel given their sum (in split order, fp32, rounded once to the dtype)."""
    import itertools

    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.gguf_gemv.act_quant import quantize_activations
    from ember.compiler.kernels.norm.kernel import add_rms_norm_kernel, rms_norm_kernel
    from ember.compiler.kernels.norm.quant_kernel import add_rms_norm_quant_kernel, launch_plan, rms_norm_quant_kernel
    from ember.tools.dev.check_dp4a_kernels import activation_buffers, compare_activations
    from ember.tools.dev.check_quant_kernels import HostBuffer

    failures = 0
    rng = np.random.default_rng(1)
    for (rows, n, dtype_name), order, add in itertools.product(
        ((1, 1536, "bfloat16"), (3, 4096, "float32"), (2, 96, "bfloat16")), ("q4_k", "q6_k"), ("", "add", "partials")
    ):
        dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
        x = (rng.standard_normal((rows, n)) * 3).astype(dtype)
        y = rng.standard_normal((rows, n)).astype(dtype)
        w = rng.uniform(0.5, 1.5, n).astype(dtype)
        plan = launch_plan(rows, n, order)
        base = {k: v for k, v in plan["meta"].items() if k in ("N", "BLOCK")}
        s, out, s_plain, out_plain = (HostBuffer(np.zeros((rows, n), dtype)) for _ in range(4))
        qa, da = activation_buffers(rows, n)
        if add:
            operand, extra = HostBuffer(y), {"SPLITS": 0, "ROWS_PAD": 0}
            if add == "partials":  # 5 splits, 2 padding rows past the row count
                parts = (rng.standard_normal((5, rows + 2, n)) * 0.5).astype(np.float32)
                y = parts[0, :rows]
                for k in range(1, 5):
                    y = y + parts[k, :rows]
                y = y.astype(dtype)
                operand, extra = HostBuffer(parts), {"SPLITS": 5, "ROWS_PAD": rows + 2}
            add_rms_norm_quant_kernel[plan["grid"]](
                HostBuffer(x), operand, HostBuffer(w), s, out, qa, da, EPS=1e-6, ASM=False, **plan["meta"], **extra
            )
            add_rms_norm_kernel[plan["grid"]](
                HostBuffer(x), HostBuffer(y), HostBuffer(w), s_plain, out_plain, EPS=1e-6, **base
            )
        else:
            rms_norm_quant_kernel[plan["grid"]](
                HostBuffer(x), HostBuffer(w), out, qa, da, EPS=1e-6, ASM=False, **plan["meta"]
            )
            rms_norm_kernel[plan["grid"]](HostBuffer(x), HostBuffer(w), out_plain, EPS=1e-6, **base)
        rows_equal = np.array_equal(out.array, out_plain.array) and (not add or np.array_equal(s.array, s_plain.array))
        qa_ref, da_ref = (np.asarray(a) for a in quantize_activations(jnp.asarray(out.array.astype(np.float32)), order))
        mismatch, note = compare_activations(qa.array, da.array, qa_ref, da_ref)
        bad = not rows_equal or mismatch
        failures += bad
        print(
            f"{'BAD' if bad else 'ok '} norm+quantize {add + ' ' if add else ''}{order} rows={rows} n={n} "
            f"{dtype_name} rows equal={rows_equal} {note}",
            flush=True,
        )
    return 1 if failures else 0


def interpret_cli(doc: str, interpret_fn, argv: list[str]) -> int:
    """The command line of an interpreter check: `interpret` runs it (exit 1 on a mismatch), else the usage."""
    if argv[:1] != ["interpret"]:
        print(doc)
        return 2
    return interpret_fn()


def main(argv: list[str]) -> int:
    return interpret_cli(__doc__, lambda: interpret() | interpret_quantized(), argv)


if __name__ == "__main__":
    from ember.tools.dev.policy_flag import run_with_policy

    sys.exit(run_with_policy(main, sys.argv[1:]))
