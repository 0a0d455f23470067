"""Benchmark the quantized GEMM (compiler/kernels/gguf_gemm/) on the GPU against what a step of many rows runs
today, in one run (run by hand on the device machine):

  gemm      quant_gemm: the packed blocks dequantized per K tile in registers, fed to tl.dot
  dequant   dequantize the packed weight to bf16 inside the step, then XLA's matmul (today's path without copies)
  bf16      XLA's matmul on a dense bf16 weight (today's default: the dense copy beside the packed blocks)
  gemv      quant_matmul(backend="triton") where the GEMV serves the rows (m <= 16)

for Q4_K / Q6_K (Q8_0 / Q5_0 with --formats) at the 8B and 1.5B projection shapes and the row counts of the
decode buckets and prefill chunks. Prints microseconds per call, TFLOP/s and gemm / bf16 (the figure the kernel
policy's choice needs: >= ~0.9 lets `weights.dense_copies` go off); writes --out JSON.
--sweep times every candidate config (CANDIDATES) per case and reports the best, for gemm.py's CONFIGS table.

  python -m ember.tools.dev.bench_quant_gemm [--formats q4_k q6_k] [--rows 8 32 128 512 4096] [--sweep] [--out F]

Timing as tools/dev/bench_quant_matmul.py: one executable of back-to-back calls on distinct weight copies
(>= 128 MB together, so weights stream from HBM), median run / calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.gguf_gemm import GemmConfig, pick_gemm_config, quant_gemm
from ember.compiler.kernels.gguf_gemv import quant_matmul
from ember.compiler.kernels.gguf_gemv.reference import dequantize, quant_matmul_ref
from ember.tools.dev.bench_quant_matmul import copies_for, random_weight, replicate, time_calls

SHAPES = {  # (out, in): q+k+v, o, gate+up, down
    "8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "1.5b": [(2048, 1536), (17920, 1536), (1536, 8960)],
}
ROWS = (8, 16, 32, 64, 128, 256, 512, 4096)
CANDIDATES = [
    GemmConfig(block_m=bm, block_n=bn, sub=sub, num_warps=w, num_stages=st)
    for bm in (16, 32, 64, 128)
    for bn in (64, 128)
    for sub in (4, 8)
    for w in (4, 8)
    for st in (2, 3)
    if not (bm == 128 and bn == 128 and w == 4)
]


def gemm_fn(config):
    return lambda x, w: quant_gemm(x, w, config)


def dequant_fn(x, w):
    return jnp.einsum("mk,ok->mo", x, dequantize(w).astype(x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)


def bf16_fn(x, w):
    return jnp.einsum("mk,ok->mo", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def rel_err(x, w, config) -> float:
    got = jax.jit(gemm_fn(config))(x, w).astype(jnp.float32)
    ref = jax.jit(quant_matmul_ref)(x.astype(jnp.float32), w)
    return float(jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref)))


def bench_shape(fmt: str, shape, rows, args, rng) -> list[dict]:
    host = random_weight(rng, fmt, shape)
    weights = replicate(host, min(copies_for(host.nbytes), args.max_calls))
    dense_bytes = 2 * shape[0] * shape[1]
    dense_host = jnp.asarray(rng.standard_normal(shape, np.float32) * 0.02, jnp.bfloat16)
    dense = replicate(dense_host, min(copies_for(dense_bytes), args.max_calls))
    results = []
    for m in rows:
        x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(jnp.bfloat16)
        config = pick_gemm_config(m)
        row = {"format": fmt, "out": shape[0], "in": shape[1], "m": m, "config": dataclasses.asdict(config)}
        row["rel_err"] = rel_err(x, weights[0], config)
        t = {
            "gemm": time_calls(gemm_fn(config), x, weights, args.runs),
            "dequant": time_calls(dequant_fn, x, weights, args.runs),
            "bf16": time_calls(bf16_fn, x, dense, args.runs),
        }
        if m <= 16:
            t["gemv"] = time_calls(lambda x, w: quant_matmul(x, w, backend="triton"), x, weights, args.runs)
        if args.sweep:
            best = None
            for cand in CANDIDATES:
                try:
                    s = time_calls(gemm_fn(cand), x, weights[: max(4, len(weights) // 4)], max(5, args.runs // 3))
                except Exception as error:  # a config over the shared-memory limit: skipped, named
                    print(f"  {cand}: {type(error).__name__}", file=sys.stderr)
                    continue
                if best is None or s < best[0]:
                    best = (s, cand)
            row["best"] = {"us": best[0] * 1e6, "config": dataclasses.asdict(best[1])}
        flop = 2 * m * shape[0] * shape[1]
        row["us"] = {k: v * 1e6 for k, v in t.items()}
        row["tflops"] = {k: flop / v / 1e12 for k, v in t.items()}
        row["gemm_over_bf16"] = t["bf16"] / t["gemm"]  # > 1: the GEMM is faster than the dense copy
        row["gemm_over_dequant"] = t["dequant"] / t["gemm"]
        results.append(row)
        extra = f" best {row['best']['us']:.1f}us {row['best']['config']}" if args.sweep else ""
        us = " ".join(f"{k} {v:.1f}" for k, v in row["us"].items())
        print(
            f"{fmt} {shape[0]}x{shape[1]} m={m}: {us} us | speed vs bf16 {row['gemm_over_bf16']:.2f}"
            f" vs dequant {row['gemm_over_dequant']:.2f} | err {row['rel_err']:.1e}{extra}",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=["q4_k", "q6_k"])
    parser.add_argument("--models", nargs="+", default=list(SHAPES))
    parser.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--max-calls", type=int, default=32)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].device_kind}", flush=True)
    rng = np.random.default_rng(0)
    results = []
    for fmt in args.formats:
        for model in args.models:
            for shape in SHAPES[model]:
                results.extend(bench_shape(fmt, shape, args.rows, args, rng))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": jax.devices()[0].device_kind, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
