"""The integer-sum invariant matmul's GEMV and GEMM compiled for sm_90 on this CPU machine, through Triton's own CUDA
pipeline down to SASS (its bundled ptxas and nvdisasm), with floating-point fusion on (Triton's default
`enable_fp_fusion`: LLVM contracts, ptxas `--fmad=true`): neither kernel's SASS holds an FFMA, so no multiply of a
block's term was contracted into an add, whatever the compiler settings (terms.py's `.rn` operations); the GEMM's
integer sums run on the int8 tensor cores (IGMMA), the GEMV's on dp4a (IDP.4A).

What runs on the GPU is XLA's compilation of the same Triton IR (compiler/kernels/triton/launch.py), whose LLVM
options differ; the inline `.rn` PTX is opaque to both, and tests/kernels/int_invariant/test_int_invariant_gpu.py
checks the bits there."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import pytest
import triton

from ember.compiler.kernels.int_invariant.config import (
    GemvLaunch,
    IntInvariantConfig,
    gemm_plan,
    gemv_plan,
    pick_gemm_launch,
)
from ember.compiler.kernels.int_invariant.gemm_kernel import int_gemm_kernel
from ember.compiler.kernels.int_invariant.gemv_kernel import int_gemv_kernel
from ember.tools.dev.ptxas import compile_sm90

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
if not all(os.path.exists(os.path.join(TOOLS, tool)) for tool in ("ptxas", "nvdisasm")):
    pytest.skip("Triton's bundled ptxas / nvdisasm are missing", allow_module_level=True)

PLANES = {"q4_k": ("*u32", "*u32", "*fp16", "*fp16"), "q6_k": ("*u32", "*u32", "*i8", "*fp16")}


def sass(kernel, pointer_types, constants, num_warps, num_stages) -> str:
    """The kernel's SASS for sm_90 (tools/dev/ptxas.py: Triton's default options, fp fusion on)."""
    compiled = compile_sm90(kernel, list(pointer_types), constants, num_warps=num_warps, num_stages=num_stages)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run([os.path.join(TOOLS, "nvdisasm"), cubin.name], capture_output=True, text=True).stdout


def count(code: str, op: str) -> int:
    return len(re.findall(rf"\b{re.escape(op)}\b", code))


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_no_float_contraction_in_either_kernel(fmt):
    config = IntInvariantConfig(512)
    n, k = 2048, 1536
    plan = gemv_plan(fmt, config, 4, n, k, GemvLaunch(), asm=True)
    gemv = sass(int_gemv_kernel, ("*i32", "*fp32", "*fp32", *PLANES[fmt], "*fp32"), plan["meta"], 4, 1)
    launch = pick_gemm_launch(4096)
    plan = gemm_plan(fmt, config, 4096, n, k, launch, asm=True)
    pointers = ("*i8", "*fp32", "*fp32", *PLANES[fmt], "*bf16")
    gemm = sass(int_gemm_kernel, pointers, plan["meta"], launch.num_warps, launch.num_stages)
    for name, code in (("gemv", gemv), ("gemm", gemm)):
        assert count(code, "FMUL") > 0 and count(code, "FADD") > 0, name
        assert count(code, "FFMA") == 0, f"{name}: a multiply was contracted into an FMA"
    assert count(gemv, "IDP.4A.U8.S8") > 0
    assert count(gemm, "IGMMA") > 0
