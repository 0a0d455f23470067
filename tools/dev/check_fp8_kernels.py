"""Check the FP8 GEMV kernel (compiler/kernels/dense_gemv/kernel.py) without a GPU (needs only triton==3.6.0), on FP8
weights and on plain bf16 ones (compiler/kernels/dense_gemv/dispatch.py: DENSE_CASES).

  python -m ember.tools.dev.check_fp8_kernels interpret   run the kernel in Triton's CPU interpreter against the
                                                      jnp path (fp8_linear_xla) and the float64 reference: CASES
  python -m ember.tools.dev.check_fp8_kernels compile     compile for sm_90 (Triton's bundled LLVM + ptxas) at the
                                                      8B decode shapes with the picked configs; registers, spills
                                                      and the load / convert / mma instructions in the PTX

The interpreter patches (numpy buffers instead of torch, bf16 through fp32) are tools/dev/check_quant_kernels.py's.
Its numpy buffers have no float8 type, so the fp8 bytes go in as uint8 and the kernel reinterprets them
(W_BITCAST: `w.to(tl.float8e4nv, bitcast=True)`); on the GPU the float8_e4m3fn array is passed as it is.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np

# (out, in, blocked, config kwargs, [(m, dtype name), ...]). Together: per-channel and block scales, m in
# {1, 3, 8, 16}, out not a multiple of block_n (masked rows) nor of 128 (a partial scale block), in not a
# multiple of block_k (masked columns) nor of 128, split_k 1 and > 1 (clamped, the last split shorter),
# block_k below, at and above 128 (a tile over two scale blocks; tl.dot: 128-wide sub-tiles), CUDA cores (with
# and without the register prefetch) and tl.dot, bf16 and f32.
CASES = [
    (200, 400, False, dict(block_n=32, block_k=128), [(1, "bfloat16"), (3, "float32")]),
    (200, 400, True, dict(block_n=32, block_k=256, split_k=2), [(1, "float32"), (3, "bfloat16")]),
    (136, 300, True, dict(block_n=16, block_k=64, split_k=3), [(8, "bfloat16"), (1, "float32")]),
    (136, 300, False, dict(block_n=16, block_k=512, split_k=4), [(1, "bfloat16")]),
    (136, 300, True, dict(block_n=16, block_k=64, split_k=2, prefetch=False), [(2, "bfloat16")]),
    (136, 300, True, dict(block_n=16, block_k=256, split_k=2, step_reduce=True), [(1, "bfloat16"), (4, "float32")]),
    (200, 400, False, dict(block_n=32, block_k=128, step_reduce=True), [(1, "float32")]),
    (200, 400, False, dict(block_n=32, block_k=128, split_k=2, use_dot=True), [(16, "bfloat16"), (8, "float32")]),
    (200, 400, True, dict(block_n=16, block_k=256, use_dot=True), [(16, "float32"), (3, "bfloat16")]),
    (72, 160, True, dict(block_n=8, block_k=32, split_k=8), [(16, "bfloat16")]),
    (72, 160, True, dict(block_n=16, block_k=64, split_k=2, use_dot=True), [(5, "bfloat16")]),
    # 4-byte words (bf16 activations only): in a multiple of 4 but not of 16 nor block_k (a partial last
    # step), split-K, m = 2, with and without the prefetch
    (200, 420, False, dict(block_n=8, block_k=256, words=True), [(1, "bfloat16"), (2, "bfloat16")]),
    (136, 300, True, dict(block_n=16, block_k=64, split_k=2, words=True), [(1, "bfloat16"), (2, "bfloat16")]),
    (72, 160, True, dict(block_n=8, block_k=32, split_k=3, words=True, prefetch=False), [(1, "bfloat16")]),
]
# the 8B decode shapes (packed q/k/v, o, packed gate/up, down) at the rows the picks distinguish
COMPILE_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
COMPILE_ROWS = (1, 2, 3, 16)


def _weight(rng, out: int, inner: int, blocked: bool):
    from ember.compiler.kernels.dense_gemv.fp8 import quantize_fp8

    w = rng.standard_normal((out, inner)) * rng.uniform(0.01, 3.0, (out, 1))
    return quantize_fp8(w.astype(np.float32), blocked=blocked)


def _weight_buffers(w, Buffer) -> tuple:
    """The kernel's weight operands as interpreter buffers: the e4m3 bytes as uint8, the scales as fp32."""
    return Buffer(np.asarray(w.values).view(np.uint8), "u8"), Buffer(np.asarray(w.scale, np.float32), "fp32")


def interpret() -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernel is decorated
    from ember.tools.dev.check_quant_kernels import HostBuffer, patch_interpreter

    patch_interpreter()
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.dense_gemv.fp8 import fp8_linear_xla, fp8_reference_matmul
    from ember.compiler.kernels.dense_gemv.kernel import Fp8GemvConfig, fp8_gemv_kernel, launch_plan

    class Buffer(HostBuffer):  # any dtype, named for the interpreter (HostBuffer's table has no u8)
        def __init__(self, array: np.ndarray, name: str) -> None:
            self.array, self.dtype = np.ascontiguousarray(array), name

    names = {"float32": (np.float32, "fp32"), "bfloat16": (ml_dtypes.bfloat16, "bf16")}
    rng = np.random.default_rng(0)
    failures = 0
    for out, inner, blocked, kwargs, runs in CASES:
        w = _weight(rng, out, inner, blocked)
        codes, scale = _weight_buffers(w, Buffer)
        config = Fp8GemvConfig(**kwargs)
        for m, dtype_name in runs:
            dtype, tname = names[dtype_name]
            x = rng.standard_normal((m, inner)).astype(dtype)
            plan = launch_plan(m, out, inner, config, blocked=blocked)
            splits = plan["split_k"]
            y = Buffer(
                np.full((splits, m, out), np.nan, dtype if splits == 1 else np.float32),
                tname if splits == 1 else "fp32",
            )
            fp8_gemv_kernel[plan["grid"]](
                Buffer(x, tname),
                codes,
                scale,
                y,
                IEEE=dtype_name == "float32",
                W_BITCAST=True,
                SCALED=True,
                **plan["meta"],
            )
            got = y.array.astype(np.float32).sum(axis=0)
            exact = fp8_reference_matmul(np.asarray(x, np.float32), w)
            jnp_path = np.asarray(fp8_linear_xla(jnp.asarray(x), w), np.float32)
            spread = np.abs(exact).max()
            err = float(np.abs(got - exact).max() / spread)
            err_jnp = float(np.abs(got - jnp_path).max() / spread)
            # f32: accumulation order only; bf16: the output's rounding (2**-9 relative) at the largest outputs
            tol = 1e-5 if dtype_name == "float32" else 2.0**-7
            bad = not (err < tol and err_jnp < tol)  # NaN (an unwritten row or split) fails too
            failures += bad
            print(
                f"{'BAD' if bad else 'ok '} {out}x{inner} {'block' if blocked else 'chan '} m={m:<2} "
                f"{dtype_name:8} bn={config.block_n:<2} bk={config.block_k:<3} dot={int(config.use_dot)} "
                f"pf={int(plan['meta']['PREFETCH'])} grid={plan['grid'][:2]} split={splits} err_f64={err:.1e} err_jnp={err_jnp:.1e}",
                flush=True,
            )
    failures += _interpret_fused_forms(rng, Buffer)
    failures += _interpret_dense(rng, Buffer)
    print(f"{failures} mismatches" if failures else "all match")
    return 1 if failures else 0


# the fused forms: (ffn, in, config kwargs, m): a packed gate/up weight [2 ffn, in] whose epilogue writes
# silu(gate) * up [m, ffn] (ffn not a multiple of block_n / 2: masked pairs), and (sizes, in, blocked, config
# kwargs, m): three projections' outputs from one launch (sizes: row-tile multiples)
GATE_UP_CASES = [
    (36, 300, dict(block_n=8, block_k=64, words=True), 1),
    (40, 160, dict(block_n=4, block_k=32, words=True, prefetch=False), 2),
    (24, 200, dict(block_n=16, block_k=64, step_reduce=True), 1),
]
PARTS_CASES = [
    ((64, 16, 24), 200, False, dict(block_n=8, block_k=64, words=True), 1),
    ((32, 32, 8), 160, True, dict(block_n=8, block_k=32, words=True, prefetch=False), 2),
]


def _interpret_fused_forms(rng, Buffer) -> int:
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.activation import gated_act_packed
    from ember.compiler.kernels.dense_gemv.fp8 import fp8_reference_matmul
    from ember.compiler.kernels.dense_gemv.kernel import (
        Fp8GemvConfig,
        fp8_gemv_kernel,
        fp8_gemv_parts_kernel,
        launch_plan,
    )

    bf16 = ml_dtypes.bfloat16
    failures = 0
    for ffn, inner, kwargs, m in GATE_UP_CASES:
        w = _weight(rng, 2 * ffn, inner, False)
        x = rng.standard_normal((m, inner)).astype(bf16)
        plan = launch_plan(m, 2 * ffn, inner, Fp8GemvConfig(**kwargs), blocked=False, gate_up=True)
        y = Buffer(np.full((m, ffn), np.nan, bf16), "bf16")
        fp8_gemv_kernel[plan["grid"]](
            Buffer(x, "bf16"), *_weight_buffers(w, Buffer), y, IEEE=False, W_BITCAST=True, SCALED=True, **plan["meta"]
        )
        product = fp8_reference_matmul(np.asarray(x, np.float32), w).astype(bf16)
        exact = np.asarray(gated_act_packed(jnp.asarray(product), act="silu"), np.float32)
        err = float(np.abs(y.array.astype(np.float32) - exact).max() / np.abs(exact).max())  # NaN: unwritten
        bad = not err < 2.0**-6  # the product's and the activation's bf16 roundings, each within an ulp
        failures += bad
        print(f"{'BAD' if bad else 'ok '} gate/up {2 * ffn}x{inner} m={m} {kwargs} err_f64={err:.1e}", flush=True)
    for sizes, inner, blocked, kwargs, m in PARTS_CASES:
        out = sum(sizes)
        w = _weight(rng, out, inner, blocked)
        x = rng.standard_normal((m, inner)).astype(bf16)
        plan = launch_plan(m, out, inner, Fp8GemvConfig(**kwargs), blocked=blocked)
        outs = [Buffer(np.full((m, size), np.nan, bf16), "bf16") for size in sizes]
        fp8_gemv_parts_kernel[plan["grid"]](
            Buffer(x, "bf16"),
            *_weight_buffers(w, Buffer),
            *outs,
            IEEE=False,
            W_BITCAST=True,
            SCALED=True,
            N1=sizes[0],
            N2=sizes[0] + sizes[1],
            **plan["meta"],
        )
        exact = fp8_reference_matmul(np.asarray(x, np.float32), w)
        got = np.concatenate([o.array.astype(np.float32) for o in outs], axis=1)
        err = float(np.abs(got - exact).max() / np.abs(exact).max())  # NaN: a part left unwritten
        bad = not err < 2.0**-7
        failures += bad
        print(
            f"{'BAD' if bad else 'ok '} parts {sizes} x {inner} {'block' if blocked else 'chan '} m={m} "
            f"err_f64={err:.1e}",
            flush=True,
        )
    return failures


# the same kernels on plain bf16 weights (compiler/kernels/dense_gemv/dispatch.py, SCALED off): (form, out or sizes, in,
# config kwargs, m, activation dtype): masked rows and columns, the prefetch on and off, split-K, f32 x
DENSE_CASES = [
    ("plain", 200, 420, dict(block_n=4, block_k=64, step_reduce=True), 1, "bfloat16"),
    ("plain", 136, 300, dict(block_n=8, block_k=128, split_k=2, step_reduce=True), 2, "float32"),
    ("plain", 72, 160, dict(block_n=4, block_k=32, step_reduce=True, prefetch=False), 1, "bfloat16"),
    ("gate_up", 36, 300, dict(block_n=4, block_k=64, step_reduce=True), 1, "bfloat16"),
    ("parts", (64, 16, 24), 200, dict(block_n=8, block_k=64, step_reduce=True), 1, "bfloat16"),
]


def _interpret_dense(rng, Buffer) -> int:
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.activation import gated_act_packed
    from ember.compiler.kernels.dense_gemv.kernel import (
        Fp8GemvConfig,
        fp8_gemv_kernel,
        fp8_gemv_parts_kernel,
        launch_plan,
    )

    bf16 = ml_dtypes.bfloat16
    names = {"float32": (np.float32, "fp32"), "bfloat16": (bf16, "bf16")}
    no_scale = Buffer(np.zeros(1, np.float32), "fp32")
    failures = 0
    for form, size, inner, kwargs, m, dtype_name in DENSE_CASES:
        out = 2 * size if form == "gate_up" else sum(size) if form == "parts" else size
        w = (rng.standard_normal((out, inner)) * rng.uniform(0.01, 3.0, (out, 1))).astype(bf16)
        dtype, tname = names[dtype_name]
        x = rng.standard_normal((m, inner)).astype(dtype)
        exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
        plan = launch_plan(m, out, inner, Fp8GemvConfig(**kwargs), blocked=False, gate_up=form == "gate_up")
        args = (Buffer(x, tname), Buffer(w, "bf16"), no_scale)
        flags = dict(IEEE=dtype_name == "float32", W_BITCAST=False, SCALED=False, **plan["meta"])
        tol = 1e-5 if dtype_name == "float32" else 2.0**-7
        if form == "parts":
            outs = [Buffer(np.full((m, part), np.nan, dtype), tname) for part in size]
            fp8_gemv_parts_kernel[plan["grid"]](*args, *outs, N1=size[0], N2=size[0] + size[1], **flags)
            got = np.concatenate([o.array.astype(np.float32) for o in outs], axis=1)
        elif form == "gate_up":
            y = Buffer(np.full((m, size), np.nan, dtype), tname)
            fp8_gemv_kernel[plan["grid"]](*args, y, **flags)
            got = y.array.astype(np.float32)
            exact = np.asarray(gated_act_packed(jnp.asarray(exact.astype(dtype)), act="silu"), np.float32)
            tol = 2.0**-6  # the product's and the activation's bf16 roundings
        else:
            splits = plan["split_k"]
            y = Buffer(
                np.full((splits, m, out), np.nan, dtype if splits == 1 else np.float32),
                tname if splits == 1 else "fp32",
            )
            fp8_gemv_kernel[plan["grid"]](*args, y, **flags)
            got = y.array.astype(np.float32).sum(axis=0)
        err = float(np.abs(got - exact).max() / np.abs(exact).max())  # NaN: something left unwritten
        bad = not err < tol
        failures += bad
        print(
            f"{'BAD' if bad else 'ok '} dense {form} {size}x{inner} m={m} {dtype_name} {kwargs} "
            f"split={plan['split_k']} err_f64={err:.1e}",
            flush=True,
        )
    return failures


def compile_all() -> int:
    from ember.compiler.kernels.dense_gemv.kernel import fp8_gemv_kernel, launch_plan, pick_fp8_config
    from ember.tools.dev.check_quant_kernels import compile_sm90, ptxas_usage

    failures = 0
    for blocked in (False, True):
        for out, inner in COMPILE_SHAPES:
            for m in COMPILE_ROWS:
                config = pick_fp8_config(m, out, inner, blocked=blocked)
                plan = launch_plan(m, out, inner, config, blocked=blocked)
                out_type = "bf16" if plan["split_k"] == 1 else "fp32"
                label = (
                    f"{'block' if blocked else 'chan '} m={m:<2} {out:>5}x{inner:<5} bn={config.block_n:<2} "
                    f"bk={config.block_k} split={plan['split_k']} warps={config.num_warps} "
                    f"stages={config.num_stages} dot={int(config.use_dot)} grid={plan['grid'][:2]}"
                )
                try:
                    compiled = compile_sm90(
                        fp8_gemv_kernel,
                        ["*bf16", "*fp8e4nv", "*fp32", "*" + out_type],
                        dict(plan["meta"], IEEE=False, W_BITCAST=False, SCALED=True),
                        num_warps=config.num_warps,
                        num_stages=config.num_stages,
                    )
                except Exception as error:
                    failures += 1
                    print(f"FAIL {label}: {type(error).__name__}: {str(error)[:400]}", flush=True)
                    continue
                ptx = compiled.asm["ptx"]
                print(
                    f"ok  {label} {ptxas_usage(ptx)} smem={compiled.metadata.shared} "
                    f"ld.v4={ptx.count('ld.global.v4')} ld.v2={ptx.count('ld.global.v2')} "
                    f"cp.async={ptx.count('cp.async.cg') + ptx.count('cp.async.ca')} "
                    f"cvt.e4m3={len(re.findall(r'cvt\.rn\.f16x2\.e4m3x2', ptx))} mma={ptx.count('mma.sync')}",
                    flush=True,
                )
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("interpret", "compile"):
        print(__doc__)
        return 2
    return interpret() if argv[0] == "interpret" else compile_all()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
