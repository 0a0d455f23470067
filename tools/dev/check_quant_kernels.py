"""Check the Triton quantized GEMV kernels without a GPU (needs only `pip install triton==3.6.0`).

  python tools/dev/check_quant_kernels.py interpret [q4_k ...]   run the kernels in Triton's CPU interpreter
                                                            against the jnp reference (small shapes)
  python tools/dev/check_quant_kernels.py rows [q4_k ...]      the "rows" variant (gguf_gemv/rows_*.py) in the
                                                            interpreter: ROWS_CASES (m 1..4, split-K, masks)
  python tools/dev/check_quant_kernels.py compile-rows [q4_k ...]  compile the rows variant for sm_90 at the
                                                            engine's decode shapes; registers and spills
                                                            from ptxas -v
  python tools/dev/check_quant_kernels.py compile [q4_k ...]    compile them for sm_90 (Triton's bundled
                                                            LLVM + ptxas) at the benchmark shapes

The interpreter is patched here for two gaps of Triton 3.6 on a torch-less machine: arguments are
numpy buffers (its torch copy-in/out is skipped), bf16 (which it stores as raw uint16 bits) is cast
and multiplied through fp32 (f32 -> bf16 rounded to nearest even, as the GPU does; it truncated), and
numpy >= 2.5's refusal of int() on 1-element arrays is worked around.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np

PLANE_TYPES = {
    "q4_k": ["*u32", "*u32", "*fp16", "*fp16"],
    "q6_k": ["*u32", "*u32", "*i8", "*fp16"],
    "q8_0": ["*i8", "*fp16"],
    "q5_0": ["*u8", "*u32", "*fp16"],
}


def patch_interpreter() -> None:
    import triton.language as tl
    import triton.runtime.interpreter as ti

    ti.GridExecutor._init_args_hst = lambda self, args_dev, kwargs: (args_dev, kwargs)
    ti.GridExecutor._restore_args_dev = lambda self, *args: None
    patch_tensor = ti._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    ti._patch_lang_tensor = _patch_lang_tensor
    builder = ti.InterpreterBuilder
    cast, dot = builder.cast_impl, builder.create_dot

    def cast_impl(self, src, dst_type):
        wide = (tl.bfloat16, tl.float32)
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar == tl.float32:  # rounded to nearest (its own truncates)
            import ml_dtypes

            return ti.TensorHandle(src.data.astype(ml_dtypes.bfloat16).view(np.uint16), tl.bfloat16)
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar not in wide:
            return cast(self, ti.TensorHandle(src.data.astype(np.float32), tl.float32), dst_type)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar not in wide:
            return cast(self, cast(self, src, tl.float32), dst_type)
        return cast(self, src, dst_type)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a, b = cast(self, a, tl.float32), cast(self, b, tl.float32)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.cast_impl = cast_impl
    builder.create_si_to_fp = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder.create_ui_to_fp = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder.create_dot = create_dot


class HostBuffer:
    """What the interpreter needs of a tensor argument: a data pointer and a Triton dtype name."""

    def __init__(self, array: np.ndarray) -> None:
        import ml_dtypes

        names = {
            np.uint32: "u32",
            np.int32: "i32",
            np.int8: "i8",
            np.uint8: "u8",
            np.float16: "fp16",
            np.float32: "fp32",
            ml_dtypes.bfloat16: "bf16",
            ml_dtypes.float8_e4m3fn: "fp8e4nv",
        }
        self.array = np.ascontiguousarray(array)
        self.dtype = next(v for k, v in names.items() if self.array.dtype == np.dtype(k))

    def data_ptr(self) -> int:
        return self.array.ctypes.data


def interpret(formats: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
    patch_interpreter()
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.gguf_gemv import (
        QuantMatmulConfig,
        launch_plan,
        pack,
        quant_matmul_ref,
        random_gguf_bytes,
    )
    from ember.compiler.kernels.gguf_gemv.split_kernel import KERNELS

    failures = 0
    configs = [QuantMatmulConfig(block_n=16), QuantMatmulConfig(block_n=32, split_k=3, blocks_per_step=4)]
    for fmt in formats:
        kernel, names = KERNELS[fmt]
        out, inner = 48, 1024  # 48 rows: the last row tile of 32 is half masked
        rng = np.random.default_rng(0)
        w = pack(random_gguf_bytes(rng, fmt, (out, inner), realistic=True), fmt, (out, inner))
        for m in (1, 3, 16, 17, 40):
            for dtype in (np.float32, ml_dtypes.bfloat16):
                x = rng.standard_normal((m, inner)).astype(dtype)
                expected = np.asarray(quant_matmul_ref(jnp.asarray(x).astype(jnp.float32), w))
                for config in configs:
                    plan = launch_plan(fmt, m, out, inner, config)
                    y = HostBuffer(np.zeros((plan["split_k"], m, out), dtype if plan["split_k"] == 1 else np.float32))
                    kernel[plan["grid"]](
                        HostBuffer(x),
                        *(HostBuffer(w.planes[n]) for n in names),
                        y,
                        IEEE=dtype == np.float32,
                        **plan["meta"],
                    )
                    got = y.array.astype(np.float32).sum(axis=0)
                    err = float(np.abs(got - expected).max() / np.abs(expected).max())
                    tol = 1e-4 if dtype == np.float32 else 1e-2
                    failures += err >= tol
                    print(
                        f"{'ok ' if err < tol else 'BAD'} {fmt} m={m:<2} {np.dtype(dtype).name:8} "
                        f"block_n={config.block_n} split_k={plan['split_k']} rel_err={err:.1e}",
                        flush=True,
                    )
    return 1 if failures else 0


# rows variant cases: (out, in), (block_n, split_k, sb_per_step, prefetch), [(m, dtype name), ...]. Together
# they cover m = 1..4 in both dtypes, split_k 1 and > 1 (the last split shorter), masked row tiles (out not
# a multiple of block_n), a last step only partly inside the range (S not dividing the split's units),
# block_n down to 4, PREFETCH off, and one super-block (split_k and S clamped).
ROWS_CASES = [
    ((40, 1536), (16, 1, 4, True), [(1, "float32"), (4, "bfloat16")]),
    ((40, 1536), (8, 4, 1, True), [(2, "float32"), (3, "bfloat16")]),
    ((20, 1280), (4, 2, 2, True), [(1, "bfloat16"), (4, "float32")]),
    ((24, 1280), (16, 1, 2, False), [(3, "float32")]),
    ((12, 256), (8, 3, 2, True), [(2, "bfloat16")]),
    ((44, 2048), (16, 2, 2, True), [(1, "bfloat16"), (2, "float32")]),  # Q4_K EXACT: 2 splits of 2 steps
]


def interpret_rows(formats: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    patch_interpreter()
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.kernels.gguf_gemv import (
        QuantMatmulConfig,
        launch_plan,
        pack,
        quant_matmul_ref,
        random_gguf_bytes,
    )
    from ember.compiler.kernels.gguf_gemv.rows_kernel import ROWS_KERNELS

    failures = 0
    dtypes = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
    for fmt in formats:
        kernel, names = ROWS_KERNELS[fmt]
        rng = np.random.default_rng(1)
        for (out, inner), (block_n, split_k, sb, pf), runs in ROWS_CASES:
            w = pack(random_gguf_bytes(rng, fmt, (out, inner), realistic=True), fmt, (out, inner))
            config = QuantMatmulConfig(variant="rows", block_n=block_n, split_k=split_k, sb_per_step=sb, prefetch=pf)
            for m, dtype_name in runs:
                dtype = dtypes[dtype_name]
                x = rng.standard_normal((m, inner)).astype(dtype)
                expected = np.asarray(quant_matmul_ref(jnp.asarray(x).astype(jnp.float32), w))
                plan = launch_plan(fmt, m, out, inner, config)
                splits = plan["split_k"]
                y = HostBuffer(np.full((splits, m, out), np.nan, dtype if splits == 1 else np.float32))
                kernel[plan["grid"]](HostBuffer(x), *(HostBuffer(w.planes[n]) for n in names), y, **plan["meta"])
                got = y.array.astype(np.float32).sum(axis=0)
                err = float(np.abs(got - expected).max() / np.abs(expected).max())
                tol = 1e-4 if dtype == np.float32 else 1e-2
                bad = not err < tol  # NaN (an unwritten row or split) fails too
                failures += bad
                meta = plan["meta"]
                print(
                    f"{'BAD' if bad else 'ok '} rows {fmt} {out}x{inner} m={m} {dtype_name:8} block_n={block_n} "
                    f"grid={plan['grid'][:2]} S={meta['S']} units/split={meta['UNITS_PER_SPLIT']} "
                    f"prefetch={meta['PREFETCH']} exact={meta.get('EXACT', '-')} rel_err={err:.1e}",
                    flush=True,
                )
    return 1 if failures else 0


def compile_sm90(kernel, types: list[str], constants: dict, *, num_warps: int, num_stages: int):
    """Compile a @triton.jit kernel for sm_90 ahead of time (no GPU needed): pointer/scalar `types` in
    argument order, then `constants` as constexprs; every array 16-byte aligned, as jax-triton assumes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {kernel.arg_names[i]: t for i, t in enumerate(types)}
    signature.update({name: "constexpr" for name in constants})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(types))}
    source = ASTSource(kernel, signature, constexprs=constants, attrs=attrs)
    return triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )


def compile_all(formats: list[str]) -> int:
    from ember.compiler.kernels.gguf_gemv import launch_plan, pick_config
    from ember.compiler.kernels.gguf_gemv.split_kernel import KERNELS

    shapes = [
        (1536, 1536),
        (256, 1536),
        (8960, 1536),
        (1536, 8960),
        (151936, 1536),
        (4096, 4096),
        (14336, 4096),
        (4096, 14336),
    ]
    failures = 0
    for fmt in formats:
        kernel, _ = KERNELS[fmt]
        for m in (1, 16):
            for dtype in ("bf16", "fp32"):
                for out, inner in shapes:
                    config = pick_config(fmt, m, out, inner)
                    if config.variant != "split":  # the rows kernels: compile-rows
                        continue
                    plan = launch_plan(fmt, m, out, inner, config)
                    out_dtype = dtype if plan["split_k"] == 1 else "fp32"
                    types = ["*" + dtype, *PLANE_TYPES[fmt], "*" + out_dtype]
                    try:
                        compiled = compile_sm90(
                            kernel,
                            types,
                            dict(plan["meta"], IEEE=dtype == "fp32"),
                            num_warps=config.num_warps,
                            num_stages=config.num_stages,
                        )
                    except Exception as error:
                        failures += 1
                        print(f"FAIL {fmt} m={m} {dtype} {out}x{inner}: {error}", flush=True)
                        continue
                    ptx = compiled.asm["ptx"]
                    print(
                        f"ok  {fmt} m={m:<2} {dtype} {out:>6}x{inner:<5} grid={plan['grid']} "
                        f"smem={compiled.metadata.shared:>6} {ptxas_usage(ptx)} ld.v4={ptx.count('ld.global.v4')} "
                        f"cp.async={ptx.count('cp.async.cg') + ptx.count('cp.async.ca')} "
                        f"mma={ptx.count('mma.sync')}",
                        flush=True,
                    )
    return 1 if failures else 0


def ptxas_usage(ptx: str) -> str:
    """'regs=N spill=S/L' from Triton's bundled ptxas -v for sm_90 (what the driver would run; XLA compiles
    the same Triton IR with its own Triton, so its counts may differ a little)."""
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "k.cubin")], capture_output=True, text=True
        )
    info = done.stdout + done.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    if not regs:
        return "regs=?"
    return f"regs={regs.group(1):>3} spill={spills.group(1)}/{spills.group(2)}" if spills else f"regs={regs.group(1)}"


def rows_compile_configs(fmt: str) -> list[tuple[int, tuple[int, int], object]]:
    """(m, shape, config): config.py's rows pick for every decode shape the engine calls, m = 1 and 4, plus
    the sweep's largest-register candidates at the first shape."""
    from ember.compiler.kernels.gguf_gemv import QuantMatmulConfig, pick_config
    from ember.tools.dev.bench_quant_matmul import DECODE_SHAPES

    cases = [(m, shape, pick_config(fmt, m, *shape)) for shape in DECODE_SHAPES[fmt] for m in (1, 4)]
    shape = DECODE_SHAPES[fmt][0]
    acc = 16 if fmt == "q6_k" else 32
    for m, target in ((1, 16), (4, 8)):  # the candidates' largest accumulator per thread (rows_candidates)
        warps = (8 if fmt in ("q8_0", "q5_0") else 1) * 64 * acc // (32 * target)
        if warps <= 8:
            cases.append(
                (
                    m,
                    shape,
                    QuantMatmulConfig(
                        variant="rows", block_n=64, split_k=1, sb_per_step=1, num_warps=warps, num_stages=1
                    ),
                )
            )
    return cases


def compile_rows(formats: list[str]) -> int:
    from ember.compiler.targets.policy import overriding

    with overriding({"quant_gemv.dp4a_formats": []}):  # the float rows kernels' picks (dp4a: check_dp4a_kernels.py)
        return _compile_rows(formats)


def _compile_rows(formats: list[str]) -> int:
    from ember.compiler.kernels.gguf_gemv import launch_plan
    from ember.compiler.kernels.gguf_gemv.rows_kernel import ROWS_KERNELS

    failures = 0
    for fmt in formats:
        kernel, _ = ROWS_KERNELS[fmt]
        for m, (out, inner), config in rows_compile_configs(fmt):
            dtype = "bf16"
            plan = launch_plan(fmt, m, out, inner, config)
            out_dtype = dtype if plan["split_k"] == 1 else "fp32"
            label = (
                f"{fmt} m={m} {out:>6}x{inner:<5} bn={config.block_n:<2} split={plan['split_k']} "
                f"S={plan['meta']['S']:<2} warps={config.num_warps}"
            )
            try:
                compiled = compile_sm90(
                    kernel,
                    ["*" + dtype, *PLANE_TYPES[fmt], "*" + out_dtype],
                    dict(plan["meta"]),
                    num_warps=config.num_warps,
                    num_stages=config.num_stages,
                )
            except Exception as error:
                failures += 1
                print(f"FAIL {label}: {error}", flush=True)
                continue
            ptx = compiled.asm["ptx"]
            print(
                f"ok  {label} {ptxas_usage(ptx)} smem={compiled.metadata.shared} "
                f"ld.v4={ptx.count('ld.global.v4')} ld.v2={ptx.count('ld.global.v2')} "
                f"cvt.f32.int={len(re.findall(r'cvt\.rn\.f32\.[su]', ptx))} "
                f"cp.async={ptx.count('cp.async')}",
                flush=True,
            )
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("interpret", "rows", "compile", "compile-rows"):
        print(__doc__)
        return 2
    formats = argv[1:] or ["q4_k", "q6_k", "q8_0", "q5_0"]
    if argv[0] == "compile-rows":
        return compile_rows(formats)
    if argv[0] == "rows":
        return interpret_rows(formats)
    return interpret(formats) if argv[0] == "interpret" else compile_all(formats)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
