"""Ahead-of-time compilation of a Triton kernel for sm_90 on any machine (Triton's bundled LLVM and ptxas; no
GPU), and ptxas's register and spill counts: what the compile_* developer checks print."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile


def compile_sm90(kernel, types: list[str], constants: dict, *, num_warps: int, num_stages: int):
    """Compile a @triton.jit kernel for sm_90: pointer/scalar `types` in argument order, then `constants` as
    constexprs; every array 16-byte aligned, as jax-triton assumes."""
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


def ptxas_usage(ptx: str) -> str:
    """'regs=N spill=S/L' from Triton's bundled ptxas -v for sm_90 (what the driver would run; XLA compiles
    the same Triton IR with its own Triton, so its counts may differ a little)."""
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
