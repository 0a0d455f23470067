"""The Gated DeltaNet and MoE kernels compiled for sm_90 ahead of time (no GPU: Triton's LLVM and ptxas) at the
hybrid / MoE checkpoints' shapes, with ptxas's registers, spills and shared memory: the first check of a launch
config before the GPU measures it.

  python -m ember.tools.dev.compile_hybrid_kernels
"""

from __future__ import annotations

from ember.compiler.kernels.gated_delta import chunked_kernel, norm_kernel, recurrent_kernel
from ember.compiler.kernels.moe import decode_kernels, grouped_kernels
from ember.tools.dev.ptxas import compile_sm90, ptxas_usage

MIXER = dict(hk=16, hv=32, dk=128, dv=128, width=4)
MOES = {"256 experts, ffn 512": (2048, 512, 256), "128 experts, ffn 768": (2048, 768, 128)}


def cases():
    """(name, kernel, pointer types, constants, warps, stages) per kernel and shape."""
    gd_types = ["*bf16"] * 3 + ["*bf16", "*fp32", "*fp32", "*i32", "*i32", "*fp32", "*fp32", "*bf16", "*fp32", "*fp32"]
    plan = recurrent_kernel.launch_plan(decode_rows=32, segments=0, segment_len=0, **MIXER)
    yield "gated_delta recurrent", recurrent_kernel.gated_delta_recurrent_kernel, gd_types, plan, 1
    plan = chunked_kernel.launch_plan(segments=1, segment_len=4096, **MIXER)
    yield "gated_delta chunked", chunked_kernel.gated_delta_chunked_kernel, gd_types, plan, 1
    plan = norm_kernel.launch_plan(32, 128)
    plan["meta"].update(EPS=1e-6, ROUND_WN=True)
    yield "gated_rms_norm", norm_kernel.gated_rms_norm_kernel, ["*bf16"] * 4, plan, 1
    for name, (d, f, experts) in MOES.items():
        plans = decode_kernels.launch_plans(1, d, f, experts, 8)
        plans["router"]["meta"]["NORMALIZE"] = True
        yield (
            f"moe router ({name})",
            decode_kernels.moe_router_kernel,
            ["*bf16", "*bf16", "*fp32", "*i32"],
            plans["router"],
            1,
        )
        types = ["*bf16", "*i32", "*bf16", "*bf16", "*fp32"]
        yield f"moe gate_up GEMV ({name})", decode_kernels.moe_gate_up_kernel, types, plans["gate_up"], 2
        types = ["*fp32", "*i32", "*fp32", "*bf16", "*bf16"]
        yield f"moe down GEMV ({name})", decode_kernels.moe_down_kernel, types, plans["down"], 2
        grouped = grouped_kernels.launch_plan(4096, d, f, experts, 8)
        types = ["*bf16", "*i32", "*i32", "*i32", "*i32", "*bf16", "*bf16", "*fp32"]
        yield f"moe grouped gate_up ({name})", grouped_kernels.moe_grouped_gate_up_kernel, types, grouped["gate_up"], 3
        types = ["*fp32", "*fp32", "*i32", "*i32", "*i32", "*bf16", "*fp32"]
        yield f"moe grouped down ({name})", grouped_kernels.moe_grouped_down_kernel, types, grouped["down"], 3


def main() -> None:
    for name, kernel, types, plan, stages in cases():
        compiled = compile_sm90(kernel, types, plan["meta"], num_warps=plan["num_warps"], num_stages=stages)
        shared = compiled.metadata.shared
        print(f"{name:40s} warps={plan['num_warps']} {ptxas_usage(compiled.asm['ptx'])} shared={shared}", flush=True)


if __name__ == "__main__":
    main()
