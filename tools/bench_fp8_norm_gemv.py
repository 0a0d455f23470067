"""Benchmark the norm-prologue FP8 GEMV (compiler/ops/quant/fp8_norm_gemv.py) against what it replaces: the
add + RMSNorm kernel (norm_gpu.add_rms_norm) then the FP8 GEMV (fp8_gemv_parts / fp8_gemv_gate_up), at the
8B decode shapes (packed q/k/v 6144x4096 as three parts, packed gate/up 28672x4096), one bf16 row. Run by
hand on the device machine:

  JAX_PLATFORMS=cuda python -m ember.tools.bench_fp8_norm_gemv [--runs 20] [--sweep]

Timing is tools/bench_fp8_gemv.py's (weights cycled through >= 128 MB of copies so they come from HBM, one
executable of >= 384 calls per run). Each fused config is first checked against the unfused pair (the sum
bit-equal, the outputs within 2 bf16 ulps), and the GEMV alone (its input already normed) is timed too: the unfused
pair pays two launches, and outside a CUDA graph each costs the host ~4-5 us. --sweep times SWEEP's configs, else the default one. Writes
$OUT/fp8_norm_gemv.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_disable_hlo_passes=dot-merger").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ember.compiler.ops.norm_gpu import add_rms_norm  # noqa: E402
from ember.compiler.ops.quant.fp8 import quantize_fp8  # noqa: E402
from ember.compiler.ops.quant.fp8_gemv import fp8_gemv_gate_up, fp8_gemv_parts  # noqa: E402
from ember.compiler.ops.quant.fp8_norm_gemv import Fp8NormGemvConfig, fp8_norm_gemv  # noqa: E402
from ember.tools.bench_fp8_gemv import copies_for, time_calls  # noqa: E402
from ember.tools.bench_quant_matmul import replicate, start_run  # noqa: E402

CASES = [("parts", 6144, 4096, (4096, 1024, 1024)), ("gate_up", 28672, 4096, ())]
SWEEP = [Fp8NormGemvConfig(block_n=bn, num_warps=w, programs_per_sm=p)
         for bn in (2, 4, 8) for w in (4, 8) for p in (2, 4, 8, 16)]
EPS = 1e-5


def unfused(form, sizes):
    def run(x, y, g, w):
        s, h = add_rms_norm(x, y, g, eps=EPS)
        outs = fp8_gemv_parts(h, w, sizes) if form == "parts" else (fp8_gemv_gate_up(h, w),)
        return s, tuple(outs)
    return run


def fused(form, sizes, config):
    return lambda x, y, g, w: fp8_norm_gemv(x, y, g, w, eps=EPS, form=form, sizes=sizes, config=config)


def agreement(a, b) -> dict:
    """The sums' equality and the outputs' largest difference in units of 2**-8 of |b| (bf16 ulps)."""
    (sa, oa), (sb, ob) = a, b
    got = np.concatenate([np.asarray(o, np.float32) for o in oa], axis=1)
    want = np.concatenate([np.asarray(o, np.float32) for o in ob], axis=1)
    ulps = np.abs(got - want) / np.maximum(np.abs(want) * 2.0 ** -8, 1e-30)
    return {"sum_equal": bool(np.array_equal(np.asarray(sa), np.asarray(sb))),
            "max_ulps": round(float(ulps.max()), 2), "equal_frac": round(float(np.mean(got == want)), 4)}


def bench_case(form, out, inner, sizes, configs, runs, bandwidth, rng) -> dict:
    w = quantize_fp8((rng.standard_normal((out, inner)) * 0.05).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((1, inner)) * 3, jnp.bfloat16)
    y = jnp.asarray(rng.standard_normal((1, inner)), jnp.bfloat16)
    g = jnp.asarray(rng.uniform(0.5, 1.5, inner), jnp.bfloat16)
    nbytes = out * inner + out * 4
    weights = replicate(w, copies_for(nbytes))
    row = {"form": form, "shape": f"{out}x{inner}", "weight_mb": round(nbytes / 1e6, 1)}
    base = unfused(form, sizes)
    want = jax.jit(base)(x, y, g, w)

    def seconds(fn):
        return time_calls(lambda xr, wr: fn(xr, y, g, wr), x, weights, runs)

    t = seconds(base)
    row["unfused_us"] = round(t * 1e6, 2)
    row["unfused_frac_copy"] = round(nbytes / t / 1e9 / bandwidth, 3)
    # the GEMV alone (one launch, as the fused kernel): what the fused kernel's prologue and walk cost beside it
    t = seconds(lambda x, y, g, w: fp8_gemv_parts(x, w, sizes) if form == "parts" else fp8_gemv_gate_up(x, w))
    row["gemv_alone_us"] = round(t * 1e6, 2)
    row["fused"] = []
    for config in configs:
        entry = dataclasses.asdict(config)
        try:
            entry.update(agreement(jax.jit(fused(form, sizes, config))(x, y, g, w), want))
            t = seconds(fused(form, sizes, config))
            entry["us"] = round(t * 1e6, 2)
            entry["frac_copy"] = round(nbytes / t / 1e9 / bandwidth, 3)
        except Exception as error:  # one failing config must not lose the rest
            entry["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        print(json.dumps(entry), flush=True)
        row["fused"].append(entry)
    print(f"{form} {out}x{inner}: unfused {row['unfused_us']} us, the GEMV alone {row['gemv_alone_us']} us",
          flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args(argv)
    out_dir, bandwidth, result = start_run(args.runs, "the unfused pair and the fused kernel on the same copies")
    rng = np.random.default_rng(0)
    configs = SWEEP if args.sweep else [Fp8NormGemvConfig()]
    for form, out, inner, sizes in CASES:
        result["cases"].append(bench_case(form, out, inner, sizes, configs, args.runs, bandwidth, rng))
        (out_dir / "fp8_norm_gemv.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
