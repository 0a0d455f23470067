"""Compile the GGUF-quantized GEMV kernels (compiler/kernels/gguf_gemv/) for sm_90 ahead of time, without a GPU
(Triton's bundled LLVM and ptxas), and print each one's registers, spills and instruction counts.

  python -m ember.tools.dev.compile_gguf_kernels split [q8_0 ...]  the "split" variant where config.py picks
                                                                  it, at the benchmark shapes (m = 1 and 16,
                                                                  bf16 and fp32)
  python -m ember.tools.dev.compile_gguf_kernels rows [q4_k ...]   the "rows" variant at the engine's decode
                                                                  shapes (config.py's picks, m = 1 and 4)
  python -m ember.tools.dev.compile_gguf_kernels dp4a             the integer-dot Q4_K / Q6_K GEMV at the
                                                                  engine's decode shapes (ASM=True), and the
                                                                  activation quantizer
  [--policy quant_gemv.act_terms=2]                               the kernel policy they are planned with

Exits 1 when a kernel fails to compile. Their results against the references (Triton's interpreter):
tests/kernels/gguf_gemv/test_*_interpret.py.
"""

from __future__ import annotations

import re
import sys

from ember.tools.dev.ptxas import compile_sm90, ptxas_usage

FORMATS = ["q4_k", "q6_k", "q8_0", "q5_0"]
# the weight planes' argument types, in the kernels' order (layout.py)
PLANE_TYPES = {
    "q4_k": ["*u32", "*u32", "*fp16", "*fp16"],
    "q6_k": ["*u32", "*u32", "*i8", "*fp16"],
    "q8_0": ["*i8", "*fp16"],
    "q5_0": ["*u8", "*u32", "*fp16"],
}


def _compiled(label: str, kernel, types: list[str], constants: dict, config) -> tuple[object, str] | None:
    """(compiled kernel, its PTX), or None after printing the failure."""
    try:
        compiled = compile_sm90(kernel, types, constants, num_warps=config.num_warps, num_stages=config.num_stages)
    except Exception as error:
        print(f"FAIL {label}: {error}", flush=True)
        return None
    return compiled, compiled.asm["ptx"]


def compile_split(formats: list[str]) -> int:
    from ember.compiler.kernels.gguf_gemv import launch_plan, pick_config
    from ember.compiler.kernels.gguf_gemv.split_kernel import KERNELS
    from ember.tools.dev.bench_quant_matmul import SHAPES  # the benchmark's 1.5B and 8B projections

    failures = 0
    for fmt in formats:
        kernel, _ = KERNELS[fmt]
        for m in (1, 16):
            for dtype in ("bf16", "fp32"):
                for out, inner in [s for shapes in SHAPES.values() for s in shapes]:
                    config = pick_config(fmt, m, out, inner)
                    if config.variant != "split":  # the rows kernels: the `rows` mode
                        continue
                    plan = launch_plan(fmt, m, out, inner, config)
                    out_dtype = dtype if plan["split_k"] == 1 else "fp32"
                    types = ["*" + dtype, *PLANE_TYPES[fmt], "*" + out_dtype]
                    label = f"{fmt} m={m:<2} {dtype} {out:>6}x{inner:<5}"
                    done = _compiled(label, kernel, types, dict(plan["meta"], IEEE=dtype == "fp32"), config)
                    if done is None:
                        failures += 1
                        continue
                    compiled, ptx = done
                    print(
                        f"ok  {label} grid={plan['grid']} smem={compiled.metadata.shared:>6} {ptxas_usage(ptx)} "
                        f"ld.v4={ptx.count('ld.global.v4')} "
                        f"cp.async={ptx.count('cp.async.cg') + ptx.count('cp.async.ca')} mma={ptx.count('mma.sync')}",
                        flush=True,
                    )
    return 1 if failures else 0


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
            config = QuantMatmulConfig(
                variant="rows", block_n=64, split_k=1, sb_per_step=1, num_warps=warps, num_stages=1
            )
            cases.append((m, shape, config))
    return cases


def compile_rows(formats: list[str]) -> int:
    from ember.compiler.kernels.gguf_gemv import launch_plan
    from ember.compiler.kernels.gguf_gemv.rows_kernel import ROWS_KERNELS
    from ember.compiler.targets.policy import overriding

    failures = 0
    with overriding({"quant_gemv.dp4a_formats": []}):  # the float rows kernels' picks (dp4a: the `dp4a` mode)
        for fmt in formats:
            kernel, _ = ROWS_KERNELS[fmt]
            for m, (out, inner), config in rows_compile_configs(fmt):
                plan = launch_plan(fmt, m, out, inner, config)
                out_dtype = "bf16" if plan["split_k"] == 1 else "fp32"
                label = (
                    f"{fmt} m={m} {out:>6}x{inner:<5} bn={config.block_n:<2} split={plan['split_k']} "
                    f"S={plan['meta']['S']:<2} warps={config.num_warps}"
                )
                types = ["*bf16", *PLANE_TYPES[fmt], "*" + out_dtype]
                done = _compiled(label, kernel, types, dict(plan["meta"]), config)
                if done is None:
                    failures += 1
                    continue
                compiled, ptx = done
                print(
                    f"ok  {label} {ptxas_usage(ptx)} smem={compiled.metadata.shared} "
                    f"ld.v4={ptx.count('ld.global.v4')} ld.v2={ptx.count('ld.global.v2')} "
                    f"cvt.f32.int={len(re.findall(r'cvt\.rn\.f32\.[su]', ptx))} cp.async={ptx.count('cp.async')}",
                    flush=True,
                )
    return 1 if failures else 0


def compile_dp4a() -> int:
    from ember.compiler.kernels.gguf_gemv import launch_plan, pick_config
    from ember.compiler.kernels.gguf_gemv.act_quant import act_terms
    from ember.compiler.kernels.gguf_gemv.act_quant_kernel import quantize_plan, quantize_rows_kernel
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
                # TERMS as the launch passes it (dp4a.py; compile_sm90 does not apply the kernel's default)
                constants = dict(plan["meta"], TERMS=act_terms())
                done = _compiled(label, dp4a_gemv_kernel, types, constants, config)
                if done is None:
                    failures += 1
                    continue
                compiled, ptx = done
                print(
                    f"ok  {label} {ptxas_usage(ptx)} smem={compiled.metadata.shared} dp4a={ptx.count('dp4a')} "
                    f"ld.v4={ptx.count('ld.global.v4')}",
                    flush=True,
                )
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
    if argv[:1] == ["split"]:
        return compile_split(argv[1:] or FORMATS)
    if argv[:1] == ["rows"]:
        return compile_rows(argv[1:] or FORMATS)
    if argv == ["dp4a"]:
        return compile_dp4a()
    print(__doc__)
    return 2


if __name__ == "__main__":
    from ember.tools.dev.policy_flag import run_with_policy

    sys.exit(run_with_policy(main, sys.argv[1:]))
