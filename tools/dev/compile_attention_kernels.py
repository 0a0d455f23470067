"""The attention kernels compiled ahead of time for sm_90 (Triton's bundled LLVM + ptxas; no GPU needed), with
their shared memory, registers, stack / local (spill) bytes and instruction counts.

  python -m ember.tools.dev.compile_attention_kernels [decode|prefill] [--policy quant_gemv.act_terms=2]

decode   compiler/kernels/attention/decode_kernel.py at the model shapes (fp32 and bf16, blocks of 16/32; the
         fused combine_quant / rope_partials kernels for bf16 rows of power-of-two heads, the former with the
         kernel policy's quant_gemv.act_terms), and every launch config tools/dev/bench_attention.py --sweep
         tries: ld.v4, 16-byte cp.async and mma counts
prefill  compiler/kernels/attention/prefill_kernel.py at every dtype / head_dim / page / split kind, and the bench
         sweep's largest tiles (tools/dev/bench_prefill_attention.py): wgmma, mma and cp.async counts

Both kinds without an argument. Exits 1 if any kernel fails to compile (every one is reported first). ~1 minute for the decode kernels.
The kernels against their references in Triton's interpreter: tests/kernels/attention/test_*_interpret.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace

from ember.tools.dev.ptxas import compile_sm90

DECODE_HEADS = {  # (hq, hkv, dh)
    "qwen2.5-1.5b": (12, 2, 128),
    "llama-3-8b": (32, 8, 128),
    "gemma3-270m": (4, 1, 256),
    "phi-like": (32, 32, 96),
}
# (chunk, hq, hkv, dh, page, table width, config changes): Qwen2.5-1.5B, Llama-3-8B, Gemma-3-270M shapes
PREFILL_SHAPES = [
    (512, 12, 2, 128, 16, 1024, {}),
    (4096, 32, 8, 128, 16, 1024, {}),
    (16, 32, 8, 128, 16, 1024, {}),
    (256, 4, 1, 256, 32, 64, {}),
    (64, 16, 16, 64, 16, 256, {}),
    (4096, 16, 16, 64, 16, 1024, {}),
    (4096, 32, 8, 128, 16, 1024, dict(block_n=128)),  # the largest tiles of the bench sweep
    (4096, 32, 8, 128, 16, 1024, dict(block_n=128, num_stages=2)),
]


def resource_usage(cubin: bytes) -> str:
    """Registers, stack and local (spill) bytes per thread, from the cuobjdump bundled with Triton."""
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


def compile_decode() -> int:
    """The decode kernels: the default launch config at every shape and dtype, then bench_attention's sweep."""
    from ember.compiler.kernels.attention.decode import DecodeAttentionConfig
    from ember.tools.dev.bench_attention import SWEEP_CONFIGS

    failures = 0
    for model, heads in DECODE_HEADS.items():
        for dtype in ("bf16", "fp32"):
            for block_size in (16, 32):
                for kind in ("single", "partials", "combine", "combine_quant", "rope_partials"):
                    if kind in ("combine_quant", "rope_partials") and (dtype != "bf16" or heads[2] & (heads[2] - 1)):
                        continue  # bf16 rows of power-of-two heads (the int8 activations; RoPE's pairs)
                    failures += _compile_decode_one(model, heads, dtype, block_size, kind, DecodeAttentionConfig())
    for config in SWEEP_CONFIGS:  # what tools/dev/bench_attention.py --sweep launches
        failures += _compile_decode_one("qwen2.5-1.5b", DECODE_HEADS["qwen2.5-1.5b"], "bf16", 16, "partials", config)
    return failures


def _compile_decode_one(model: str, heads: tuple[int, int, int], dtype: str, block_size: int, kind: str, config):
    from ember.compiler.kernels.attention.decode import combine_meta, decode_launch_plan
    from ember.compiler.kernels.attention.decode_kernel import KERNELS
    from ember.compiler.kernels.gguf_gemv.act_quant import act_terms

    hq, hkv, dh = heads
    kind_label = kind
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
    if kind == "combine":  # the partials (fp32) of the plan's own split count -> out
        types = ["*fp32"] * 3 + ["*" + dtype]
        plan["meta"] = combine_meta(plan["meta"], plan["splits"])
    elif kind == "combine_quant":  # -> out, qa, da (packed for Q6_K: the permuted order)
        types = ["*fp32"] * 3 + ["*" + dtype, "*i32", "*fp32"]
        # every constexpr given: an ahead-of-time compile does not apply the kernel's defaults (TERMS = 1)
        terms = act_terms()
        plan["meta"] = {**combine_meta(plan["meta"], plan["splits"]), "Q6": True, "ASM": True, "TERMS": terms}
        kind_label = f"combine_quant terms={terms}"
    elif kind == "rope_partials":  # q, k, v, inv_freq, slots, pools, table / ctx / pos / window -> partials, pools
        types = (
            ["*" + dtype] * 3 + ["*fp32", "*i32"] + ["*" + dtype] * 2 + ["*i32"] * 4 + ["*fp32"] * 3 + ["*" + dtype] * 2
        )
        plan["meta"] = {**plan["meta"], "INTERLEAVED": False, "WRITE_KV": True}
    else:  # q, pools, table / ctx / pos / window -> out (single) or the fp32 partials
        outs = [dtype] if kind == "single" else ["fp32"] * 3
        types = ["*" + dtype] * 3 + ["*i32"] * 4 + ["*" + t for t in outs]
    label = (
        f"{model:13} {dtype} bs={block_size} {kind_label:8} block_n={plan['block_n']:<3} "
        f"warps={config.num_warps} stages={config.num_stages}"
    )
    try:
        compiled = compile_sm90(
            KERNELS[kind], types, dict(plan["meta"]), num_warps=config.num_warps, num_stages=config.num_stages
        )
    except Exception as error:  # report every kernel, then fail
        print(f"FAIL {label}: {error}", flush=True)
        return 1
    ptx = compiled.asm["ptx"]
    print(
        f"ok  {label} smem={compiled.metadata.shared:>6} {resource_usage(compiled.asm['cubin'])} "
        f"ld.v4={ptx.count('ld.global.v4')} cp.async.16B={ptx.count('], 0x10')} mma={ptx.count('mma.sync')}",
        flush=True,
    )
    return 0


def compile_prefill() -> int:
    """The prefill kernel at PREFILL_SHAPES, bf16 and fp32 (pick_config's launch config; the sweep's tile
    variants bf16 only)."""
    from ember.compiler.kernels.attention.prefill import launch_plan, pick_config
    from ember.compiler.kernels.attention.prefill_kernel import prefill_attention_kernel as kernel

    failures = 0
    for dtype in ("bf16", "fp32"):
        for chunk, hq, hkv, dh, page, width, changes in PREFILL_SHAPES:
            if changes and dtype == "fp32":
                continue
            config = replace(pick_config(dh, "float32" if dtype == "fp32" else "bfloat16"), **changes)
            plan = launch_plan(chunk, hq, hkv, dh, page, width, scale=dh**-0.5, config=config)
            out_dtype = dtype if plan.splits == 1 else "fp32"
            # q, k / v pools, table, chunk info -> out (or the fp32 partials), m, l
            types = ["*" + dtype] * 3 + ["*i32"] * 2 + ["*" + out_dtype, "*fp32", "*fp32"]
            constants = dict(plan.meta, IEEE=dtype == "fp32")
            label = f"{dtype} C={chunk:<5} hq/hkv/dh={hq}/{hkv}/{dh} page={page}"
            try:
                compiled = compile_sm90(
                    kernel, types, constants, num_warps=config.num_warps, num_stages=config.num_stages
                )
            except Exception as error:  # report every shape, then fail
                failures += 1
                print(f"FAIL {label} {config}: {error}", flush=True)
                continue
            ptx = compiled.asm["ptx"]
            print(
                f"ok  {label} grid={plan.grid} bm={plan.block_m} bn={plan.block_n} warps={config.num_warps} "
                f"stages={config.num_stages} smem={compiled.metadata.shared} {resource_usage(compiled.asm['cubin'])} "
                f"wgmma={ptx.count('wgmma.mma_async')} mma={ptx.count('mma.sync')} "
                f"cp.async={ptx.count('cp.async.cg') + ptx.count('cp.async.ca')}",
                flush=True,
            )
    return failures


def main(argv: list[str]) -> int:
    kinds = {"decode": compile_decode, "prefill": compile_prefill}
    if argv and (len(argv) > 1 or argv[0] not in kinds):
        print(__doc__)
        return 2
    failures = sum(kinds[kind]() for kind in (argv or kinds))
    return 1 if failures else 0


if __name__ == "__main__":
    from ember.tools.dev.policy_flag import run_with_policy

    sys.exit(run_with_policy(main, sys.argv[1:]))
