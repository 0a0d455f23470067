"""Compile the FP8 decode GEMV (compiler/kernels/dense_gemv/kernel.py) for sm_90 on any machine (Triton's bundled
LLVM + ptxas; no GPU) at the 8B decode shapes with the configs pick_fp8_config picks, per-channel and block
scales: registers, spills, shared memory and the load / convert / mma instructions in the PTX.

  python -m ember.tools.dev.compile_dense_gemv_kernels     exit 1 if any config fails to compile

Its numerics in Triton's interpreter: tests/kernels/dense_gemv/test_fp8_gemv_interpret.py.
"""

from __future__ import annotations

import re
import sys

# the 8B decode shapes (packed q/k/v, o, packed gate/up, down) at the rows the picks distinguish
COMPILE_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
COMPILE_ROWS = (1, 2, 3, 16)


def compile_all() -> int:
    from ember.compiler.kernels.dense_gemv.kernel import fp8_gemv_kernel, launch_plan, pick_fp8_config
    from ember.tools.dev.ptxas import compile_sm90, ptxas_usage

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
    if argv:
        print(__doc__)
        return 2
    return compile_all()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
