"""The batch-invariant matmul reading GGUF weights packed (compiler/kernels/invariant_matmul/, FMT = the format)
against the same kernel over the weight's dense bf16 copy and against what default decoding runs for that many
rows (gguf_gemv/linear.py under the h200 policy: the quantized GEMV, or the copy's cuBLAS GEMM above its rows).
Per projection of a Q4_K_M checkpoint (Q4_K, the down projections and the head Q6_K): whether packed and dense
give the same bits at every row count and in both forms, and each form's time per call. Prints a table; --out
writes JSON.

  python -m ember.tools.dev.bench_invariant_packed [--out FILE] [--rows 1 8 32 128] [--shapes 1.5b]

Timing as bench_invariant_matmul.py (weight copies past 256 MB, long minus short loop of chained passes).
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
from ember.compiler.kernels.gguf_gemv.layout import DenseBacked
from ember.compiler.kernels.gguf_gemv.linear import linear as default_linear
from ember.compiler.kernels.gguf_gemv.reference import dequantize
from ember.compiler.kernels.invariant_matmul.matmul import invariant_matmul
from ember.compiler.targets.h200 import H200
from ember.compiler.targets.policy import use_kernel_policy

from .bench_invariant_matmul import timed_per_call, write_results

# (name, format, n, k): a Q4_K_M checkpoint's projections (its down projections and head are Q6_K)
SHAPES = (
    ("1.5b qkv", "q4_k", 2048, 1536),
    ("1.5b o", "q4_k", 1536, 1536),
    ("1.5b gate_up", "q4_k", 17920, 1536),
    ("1.5b down", "q6_k", 1536, 8960),
    ("1.5b head", "q6_k", 151936, 1536),
    ("8b qkv", "q4_k", 6144, 4096),
    ("8b gate_up", "q4_k", 28672, 4096),
    ("8b down", "q6_k", 4096, 14336),
)
BIT_ROWS = (1, 2, 8, 17, 64, 256, 257, 1024)


def same_bits(w, dense, k: int) -> dict:
    """Packed against dense, per row count and in both forms (one x of 1,024 rows, row prefixes)."""
    x = jax.random.normal(jax.random.key(k), (max(BIT_ROWS), k), jnp.float32).astype(jnp.bfloat16)
    f = jax.jit(invariant_matmul, static_argnames="split_form")
    want = np.asarray(f(x, dense, split_form=False).astype(jnp.float32))
    ok = {}
    for m in BIT_ROWS:
        ok[m] = bool(np.array_equal(np.asarray(f(x[:m], w).astype(jnp.float32)), want[:m]))
    ok["forms"] = bool(np.array_equal(np.asarray(f(x[:64], w, split_form=True).astype(jnp.float32)), want[:64]))
    ok["split_dense"] = bool(
        np.array_equal(np.asarray(f(x[:64], dense, split_form=True).astype(jnp.float32)), want[:64])
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--shapes", default="", help="only shapes whose name starts with this")
    parser.add_argument("--out")
    args = parser.parse_args()
    results = []
    for name, fmt, n, k in SHAPES:
        if not name.startswith(args.shapes):
            continue
        w = jax.device_put(
            pack(random_gguf_bytes(np.random.default_rng(n + k), fmt, (n, k), realistic=True), fmt, (n, k))
        )
        dense = jax.jit(lambda w: dequantize(w).astype(jnp.bfloat16))(w)
        copies = max(1, math.ceil(256e6 / w.nbytes))
        packed_ws = [jax.tree.map(jnp.copy, w) for _ in range(copies)]
        dense_ws = [jnp.copy(dense) for _ in range(max(1, math.ceil(256e6 / (2 * n * k))))]
        backed_ws = [  # each form cycles over its own copies (>= 256 MB of either)
            DenseBacked(packed_ws[i % len(packed_ws)], dense_ws[i % len(dense_ws)])
            for i in range(max(len(packed_ws), len(dense_ws)))
        ]
        entry = {"shape": name, "format": fmt, "n": n, "k": k, "same_bits": same_bits(w, dense, k), "us": {}}

        def default(x, w):
            with use_kernel_policy(H200.policy):
                return default_linear(x, w)

        for m in args.rows:
            x = jax.random.normal(jax.random.key(m), (m, k), jnp.float32).astype(jnp.bfloat16)
            packed = timed_per_call(invariant_matmul, x, packed_ws)
            dense_s = timed_per_call(invariant_matmul, x, dense_ws)
            default_s = timed_per_call(default, x, backed_ws)
            entry["us"][m] = {
                "packed": round(packed * 1e6, 2),
                "dense": round(dense_s * 1e6, 2),
                "default": round(default_s * 1e6, 2),
                "packed_over_default": round(packed / default_s, 3),
                "packed_gb_s": round(w.nbytes / packed / 1e9, 1),
            }
        results.append(entry)
        bad = [key for key, value in entry["same_bits"].items() if not value]
        print(
            f"{name:13s} {fmt} n={n:6d} k={k:5d} same_bits={'yes' if not bad else bad} "
            + " ".join(f"m{m}:{v['packed']:.1f}/{v['dense']:.1f}/{v['default']:.1f}us" for m, v in entry["us"].items()),
            flush=True,
        )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
