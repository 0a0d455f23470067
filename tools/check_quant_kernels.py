"""Check the Triton quantized GEMV kernels without a GPU (needs only `pip install triton==3.6.0`).

  python tools/check_quant_kernels.py interpret [q4_k ...]   run the kernels in Triton's CPU interpreter
                                                            against the jnp reference (small shapes)
  python tools/check_quant_kernels.py rows [q4_k]          the "rows" variant (triton_gemv.py) in the
                                                            interpreter: m in {1, 3, 4}, masked row tiles
  python tools/check_quant_kernels.py compile-rows [q4_k]  compile the rows variant for sm_90
  python tools/check_quant_kernels.py compile [q4_k ...]    compile them for sm_90 (Triton's bundled
                                                            LLVM + ptxas) at the benchmark shapes

The interpreter is patched here for two gaps of Triton 3.6 on a torch-less machine: arguments are
numpy buffers (its torch copy-in/out is skipped), bf16 (which it stores as raw uint16 bits) is cast
and multiplied through fp32, and numpy >= 2.5's refusal of int() on 1-element arrays is worked around.
"""

from __future__ import annotations

import os
import sys

import numpy as np

PLANE_TYPES = {"q4_k": ["*u32", "*u32", "*fp16", "*fp16"], "q6_k": ["*u32", "*u32", "*i8", "*fp16"],
               "q8_0": ["*i8", "*fp16"]}


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

        names = {np.uint32: "u32", np.int8: "i8", np.float16: "fp16", np.float32: "fp32", ml_dtypes.bfloat16: "bf16"}
        self.array = np.ascontiguousarray(array)
        self.dtype = next(v for k, v in names.items() if self.array.dtype == np.dtype(k))

    def data_ptr(self) -> int:
        return self.array.ctypes.data


def interpret(formats: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
    patch_interpreter()
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.ops.quant import QuantMatmulConfig, launch_plan, pack, quant_matmul_ref, random_gguf_bytes
    from ember.compiler.ops.quant.triton_kernels import KERNELS

    failures = 0
    configs = [QuantMatmulConfig(block_n=16), QuantMatmulConfig(block_n=32, split_k=3, blocks_per_step=4)]
    for fmt in formats:
        kernel, names = KERNELS[fmt]
        out, inner = 48, 1024  # 48 rows: the last row tile of 32 is half masked
        rng = np.random.default_rng(0)
        w = pack(random_gguf_bytes(rng, fmt, (out, inner), realistic=True), fmt, (out, inner))
        for m in (1, 3, 16, 17):
            for dtype in (np.float32, ml_dtypes.bfloat16):
                x = rng.standard_normal((m, inner)).astype(dtype)
                expected = np.asarray(quant_matmul_ref(jnp.asarray(x).astype(jnp.float32), w))
                for config in configs:
                    plan = launch_plan(fmt, m, out, inner, config)
                    y = HostBuffer(np.zeros((plan["split_k"], m, out), dtype if plan["split_k"] == 1 else np.float32))
                    kernel[plan["grid"]](HostBuffer(x), *(HostBuffer(w.planes[n]) for n in names), y,
                                         IEEE=dtype == np.float32, **plan["meta"])
                    got = y.array.astype(np.float32).sum(axis=0)
                    err = float(np.abs(got - expected).max() / np.abs(expected).max())
                    tol = 1e-4 if dtype == np.float32 else 1e-2
                    failures += err >= tol
                    print(f"{'ok ' if err < tol else 'BAD'} {fmt} m={m:<2} {np.dtype(dtype).name:8} "
                          f"block_n={config.block_n} split_k={plan['split_k']} rel_err={err:.1e}", flush=True)
    return 1 if failures else 0


def interpret_rows(formats: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    patch_interpreter()
    import jax.numpy as jnp
    import ml_dtypes

    from ember.compiler.ops.quant import QuantMatmulConfig, launch_plan, pack, quant_matmul_ref, random_gguf_bytes
    from ember.compiler.ops.quant.triton_gemv import ROWS_KERNELS

    failures = 0
    # (out, in): 6 super-blocks (K = 1536's count: S=4 leaves a half-masked last step), 5 (odd), 1
    cases = [((40, 1536), (16, 4, True)), ((40, 1536), (32, 2, True)), ((24, 1280), (16, 2, False)),
             ((24, 1280), (16, 8, True)), ((20, 256), (16, 1, True))]
    for fmt in formats:
        kernel, names = ROWS_KERNELS[fmt]
        rng = np.random.default_rng(1)
        for (out, inner), (block_n, sb, pf) in cases:
            w = pack(random_gguf_bytes(rng, fmt, (out, inner), realistic=True), fmt, (out, inner))
            config = QuantMatmulConfig(variant="rows", block_n=block_n, sb_per_step=sb, prefetch=pf)
            for m in (1, 3, 4):
                for dtype in (np.float32, ml_dtypes.bfloat16):
                    x = rng.standard_normal((m, inner)).astype(dtype)
                    expected = np.asarray(quant_matmul_ref(jnp.asarray(x).astype(jnp.float32), w))
                    plan = launch_plan(fmt, m, out, inner, config)
                    y = HostBuffer(np.full((m, out), np.nan, dtype))
                    kernel[plan["grid"]](HostBuffer(x), *(HostBuffer(w.planes[n]) for n in names), y, **plan["meta"])
                    got = y.array.astype(np.float32)
                    err = float(np.abs(got - expected).max() / np.abs(expected).max())
                    tol = 1e-4 if dtype == np.float32 else 1e-2
                    bad = not err < tol  # NaN (an unwritten row) fails too
                    failures += bad
                    print(f"{'BAD' if bad else 'ok '} rows {fmt} {out}x{inner} m={m} {np.dtype(dtype).name:8} "
                          f"block_n={block_n} S={sb} prefetch={plan['meta']['PREFETCH']} grid={plan['grid'][0]} "
                          f"rel_err={err:.1e}", flush=True)
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
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def compile_all(formats: list[str], rows: bool = False) -> int:
    from ember.compiler.ops.quant import QuantMatmulConfig, launch_plan, pick_config
    from ember.compiler.ops.quant.triton_gemv import ROWS_KERNELS
    from ember.compiler.ops.quant.triton_kernels import KERNELS

    shapes = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960), (151936, 1536),
              (4096, 4096), (14336, 4096), (4096, 14336)]
    failures = 0
    for fmt in formats:
        kernel, _ = (ROWS_KERNELS if rows else KERNELS)[fmt]
        for m in ((1, 4) if rows else (1, 16)):
            for dtype in ("bf16", "fp32"):
                for out, inner in shapes:
                    config = (QuantMatmulConfig(variant="rows", block_n=64 if m == 1 else 32, sb_per_step=2)
                              if rows else pick_config(fmt, m, out, inner))
                    plan = launch_plan(fmt, m, out, inner, config)
                    out_dtype = dtype if plan["split_k"] == 1 else "fp32"
                    types = ["*" + dtype, *PLANE_TYPES[fmt], "*" + out_dtype]
                    constants = dict(plan["meta"]) if rows else dict(plan["meta"], IEEE=dtype == "fp32")
                    try:
                        compiled = compile_sm90(kernel, types, constants, num_warps=config.num_warps,
                                                num_stages=config.num_stages)
                    except Exception as error:
                        failures += 1
                        print(f"FAIL {fmt} m={m} {dtype} {out}x{inner}: {error}", flush=True)
                        continue
                    ptx = compiled.asm["ptx"]
                    print(f"ok  {fmt} m={m:<2} {dtype} {out:>6}x{inner:<5} grid={plan['grid']} "
                          f"smem={compiled.metadata.shared:>6} regs={getattr(compiled, 'n_regs', '?')} "
                          f"ld.v4={ptx.count('ld.global.v4')} cp.async={ptx.count('cp.async.cg') + ptx.count('cp.async.ca')} "
                          f"mma={ptx.count('mma.sync')}", flush=True)
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("interpret", "rows", "compile", "compile-rows"):
        print(__doc__)
        return 2
    formats = argv[1:] or ["q4_k", "q6_k", "q8_0"]
    if argv[0] == "compile-rows":
        return compile_all(argv[1:] or ["q4_k"], rows=True)
    if argv[0] == "rows":
        return interpret_rows(argv[1:] or ["q4_k"])
    return interpret(formats) if argv[0] == "interpret" else compile_all(formats)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
