"""Check the RMSNorm kernels (compiler/ops/norm_gpu.py) without a GPU (needs only triton==3.6.0).

  python -m ember.tools.check_norm_kernels interpret   run both kernels in Triton's CPU interpreter against
                                                       norm.py's references: CASES
The interpreter patches (numpy buffers, bf16 through fp32) are tools/check_quant_kernels.py's, plus fp32 -> bf16
rounding to nearest even (the interpreter truncates; the GPU rounds), so the residual sum can be compared exactly.
"""

from __future__ import annotations

import os
import sys

import numpy as np

# (rows, n, dtype name, eps): n a power of two and not (a masked tile), one row and several, bf16 and f32,
# the hidden sizes of the benchmark shapes (1536, 4096)
CASES = [(1, 1536, "bfloat16", 1e-6), (3, 4096, "bfloat16", 1e-5), (5, 96, "float32", 1e-6),
         (2, 1536, "float32", 1e-5), (7, 40, "bfloat16", 1e-6)]


def patch_interpreter_rne() -> None:
    """check_quant_kernels' interpreter patches, plus fp32 -> bf16 rounding to nearest even: the interpreter
    rounds toward zero; the GPU (and the reference) round to nearest even. Call before importing kernels."""
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
    from ember.tools.check_quant_kernels import patch_interpreter

    patch_interpreter()
    import ml_dtypes
    import triton.language as tl
    import triton.runtime.interpreter as ti

    builder, cast = ti.InterpreterBuilder, ti.InterpreterBuilder.cast_impl

    def cast_rne(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return ti.TensorHandle(src.data.astype(ml_dtypes.bfloat16).view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    builder.cast_impl = cast_rne


def interpret() -> int:
    patch_interpreter_rne()
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.ops import norm
    from ember.tools.check_quant_kernels import HostBuffer
    from ember.compiler.ops.norm_gpu import add_rms_norm_kernel, launch_plan, rms_norm_kernel

    failures = 0
    rng = np.random.default_rng(0)
    for rows, n, dtype_name, eps in CASES:
        dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float32
        x = (rng.standard_normal((rows, n)) * rng.uniform(0.1, 4.0, (rows, 1))).astype(dtype)
        y = rng.standard_normal((rows, n)).astype(dtype)
        w = rng.uniform(0.5, 1.5, n).astype(dtype)
        plan = launch_plan(rows, n)
        want_s, want = (np.asarray(a).astype(np.float32)
                        for a in norm.add_rms_norm(jnp.asarray(x), jnp.asarray(y), jnp.asarray(w), eps=eps))
        want_alone = np.asarray(norm.rms_norm(jnp.asarray(x), jnp.asarray(w), eps=eps)).astype(np.float32)
        s, out, alone = (HostBuffer(np.zeros((rows, n), dtype)) for _ in range(3))
        add_rms_norm_kernel[plan["grid"]](HostBuffer(x), HostBuffer(y), HostBuffer(w), s, out, EPS=eps, **plan["meta"])
        rms_norm_kernel[plan["grid"]](HostBuffer(x), HostBuffer(w), alone, EPS=eps, **plan["meta"])
        # the sum is rounded as the reference rounds it: equal; the norm within one rounding of the dtype
        tol = 1e-5 if dtype_name == "float32" else 2 ** -7
        sum_ok = np.array_equal(s.array.astype(np.float32), want_s)
        errs = [float(np.max(np.abs(got.array.astype(np.float32) - ref) / (np.abs(ref) + 1e-3)))
                for got, ref in ((out, want), (alone, want_alone))]
        bad = not sum_ok or max(errs) > tol
        failures += bad
        print(f"{'BAD' if bad else 'ok '} rows={rows} n={n} {dtype_name:8} sum_equal={sum_ok} "
              f"rel_err add_rms_norm={errs[0]:.1e} rms_norm={errs[1]:.1e}", flush=True)
    return 1 if failures else 0


def interpret_cli(doc: str, interpret_fn, argv: list[str]) -> int:
    """The command line of an interpreter check: `interpret` runs it (exit 1 on a mismatch), else the usage."""
    if argv[:1] != ["interpret"]:
        print(doc)
        return 2
    return interpret_fn()


def main(argv: list[str]) -> int:
    return interpret_cli(__doc__, interpret, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
