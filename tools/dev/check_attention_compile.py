"""`check_attention_kernels.py compile`: the decode attention kernels compiled for sm_90 (Triton's bundled
LLVM + ptxas) at the model shapes and every launch config tools/dev/bench_attention.py --sweep tries, with
their shared memory, registers, stack/local (spill) bytes, 16-byte cp.async, ld.v4 and mma counts."""

from __future__ import annotations

import os
import re

COMPILE_HEADS = {
    "qwen2.5-1.5b": (12, 2, 128),
    "llama-3-8b": (32, 8, 128),
    "gemma3-270m": (4, 1, 256),
    "phi-like": (32, 32, 96),
}


def _resource_usage(cubin: bytes) -> str:
    """Registers, stack and local (spill) bytes per thread, from the cuobjdump bundled with Triton."""
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        try:
            text = subprocess.run([tool, "-res-usage", file.name], capture_output=True, text=True).stdout
        except OSError:
            return "regs=? stack=? local=?"
    found = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text))
    return f"regs={found.get('REG', '?'):>3} stack={found.get('STACK', '?')} local={found.get('LOCAL', '?')}"


def compile_all() -> int:
    from ember.compiler.kernels.attention.decode import DecodeAttentionConfig
    from ember.tools.dev.bench_attention import SWEEP_CONFIGS

    failures = 0
    for model, heads in COMPILE_HEADS.items():  # the default launch config at every shape and dtype
        for dtype in ("bf16", "fp32"):
            for block_size in (16, 32):
                for kind in ("single", "partials", "combine", "combine_quant", "rope_partials"):
                    if kind in ("combine_quant", "rope_partials") and (dtype != "bf16" or heads[2] & (heads[2] - 1)):
                        continue  # bf16 rows of power-of-two heads (the int8 activations; RoPE's pairs)
                    failures += _compile_one(model, heads, dtype, block_size, kind, DecodeAttentionConfig())
    for config in SWEEP_CONFIGS:  # what tools/dev/bench_attention.py --sweep launches
        failures += _compile_one("qwen2.5-1.5b", COMPILE_HEADS["qwen2.5-1.5b"], "bf16", 16, "partials", config)
    return 1 if failures else 0


def _compile_one(model: str, heads: tuple[int, int, int], dtype: str, block_size: int, kind: str, config) -> int:
    from ember.compiler.kernels.attention.decode import combine_meta, decode_launch_plan
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.tools.dev.check_quant_kernels import compile_sm90

    hq, hkv, dh = heads
    plan = decode_launch_plan(
        1,
        hq,
        hkv,
        dh,
        block_size,
        32768 // block_size,
        dot_fp32=dtype == "fp32",
        scale=dh**-0.5,
        config=config,
        splits=None if kind == "combine" else 1 if kind == "single" else 4,
    )
    kernel = KERNELS[kind]
    if kind == "combine":  # the partials (fp32) of the plan's own split count -> out
        types = ["*fp32"] * 3 + ["*" + dtype]
        plan["meta"] = combine_meta(plan["meta"], plan["splits"])
    elif kind == "combine_quant":  # -> out, qa, da (packed for Q6_K: the permuted order)
        types = ["*fp32"] * 3 + ["*" + dtype, "*i32", "*fp32"]
        plan["meta"] = {**combine_meta(plan["meta"], plan["splits"]), "Q6": True, "ASM": True}
    elif kind == "rope_partials":  # q, k, v, inv_freq, slots, pools, table / ctx / pos / window -> partials, pools
        types = (
            ["*" + dtype] * 3 + ["*fp32", "*i32"] + ["*" + dtype] * 2 + ["*i32"] * 4 + ["*fp32"] * 3 + ["*" + dtype] * 2
        )
        plan["meta"] = {**plan["meta"], "INTERLEAVED": False, "WRITE_KV": True}
    else:
        outs = [dtype] if kind == "single" else ["fp32"] * 3
        types = ["*" + dtype] * 3 + ["*i32"] * 4 + ["*" + t for t in outs]
    label = (
        f"{model:13} {dtype} bs={block_size} {kind:8} block_n={plan['block_n']:<3} "
        f"warps={config.num_warps} stages={config.num_stages}"
    )
    try:
        compiled = compile_sm90(
            kernel, types, dict(plan["meta"]), num_warps=config.num_warps, num_stages=config.num_stages
        )
    except Exception as error:
        print(f"FAIL {label}: {error}", flush=True)
        return 1
    ptx = compiled.asm["ptx"]
    print(
        f"ok  {label} smem={compiled.metadata.shared:>6} {_resource_usage(compiled.asm['cubin'])} "
        f"ld.v4={ptx.count('ld.global.v4')} cp.async.16B={ptx.count('], 0x10')} mma={ptx.count('mma.sync')}",
        flush=True,
    )
    return 0
