"""The integer-sum invariant matmul (compiler/kernels/int_invariant/) on the GPU, per projection of a Q4_K_M checkpoint
(Q4_K; the down projections and the head Q6_K): its GEMV and its GEMM against the dense invariant matmul
(invariant_matmul/ over the weight's bf16 copy: what deterministic plans run today) and against what default decoding
runs for that many rows (gguf_gemv/linear.py under the h200 policy), per call; the activations' quantizer alone; and
whether the GEMV and the GEMM give every row the same bits at every row count (and the default form by row count).
Prints a table; --out writes JSON.

  python -m ember.tools.dev.bench_int_invariant [--out FILE] [--rows 1 8 32 64 128 256 4096] [--shapes 1.5b]

Timing as bench_invariant_matmul.py's timed_per_call (weight copies past 256 MB, long minus short loop of chained
passes); each int_invariant call includes its activation quantizer. The GEMV is timed up to --gemv-max-rows rows.
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
from ember.compiler.kernels.int_invariant.config import pick_config
from ember.compiler.kernels.int_invariant.matmul import int_invariant_matmul, quantize_gpu
from ember.compiler.kernels.invariant_matmul.matmul import invariant_matmul
from ember.compiler.targets.h200 import H200
from ember.compiler.targets.policy import use_kernel_policy

from .bench_invariant_matmul import timed_per_call, write_results
from .bench_invariant_packed import SHAPES

BIT_ROWS = (1, 2, 3, 8, 16, 17, 64, 255, 256, 257, 1024)


def same_bits(w, k: int) -> dict:
    """GEMV and GEMM against the GEMM over 1,024 rows, per row count (row prefixes of one x)."""
    x = jax.random.normal(jax.random.key(k), (max(BIT_ROWS), k), jnp.float32).astype(jnp.bfloat16)
    f = jax.jit(int_invariant_matmul, static_argnames=("out_dtype", "form"))
    want = np.asarray(f(x, w, jnp.float32, form="gemm"))
    ok = {}
    for m in BIT_ROWS:
        got = {form: np.asarray(f(x[:m], w, jnp.float32, form=form)) for form in ("gemv", "gemm", None)}
        ok[m] = all(np.array_equal(value, want[:m]) for value in got.values())
    dense = np.asarray(x[:64], np.float64) @ np.asarray(dequantize(w), np.float64).T
    ok["rel_err_vs_f64"] = float(np.abs(want[:64] - dense).max() / np.abs(dense).max())
    return ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 4096])
    parser.add_argument("--gemv-max-rows", type=int, default=256, help="time the GEMV up to this many rows")
    parser.add_argument("--shapes", default="", help="only shapes whose name starts with this")
    parser.add_argument("--no-bits", action="store_true", help="skip the bits check (timings only)")
    parser.add_argument("--out")
    args = parser.parse_args()
    results = []
    gemv = lambda x, w: int_invariant_matmul(x, w, form="gemv")  # noqa: E731
    gemm = lambda x, w: int_invariant_matmul(x, w, form="gemm")  # noqa: E731
    quantize = lambda x, w: quantize_gpu(x)[1]  # noqa: E731  (dx [m, k/32]: a 2-D output to chain passes on)

    def default(x, w):
        with use_kernel_policy(H200.policy):
            return default_linear(x, w)

    for name, fmt, n, k in SHAPES:
        if not name.startswith(args.shapes):
            continue
        w = jax.device_put(
            pack(random_gguf_bytes(np.random.default_rng(n + k), fmt, (n, k), realistic=True), fmt, (n, k))
        )
        dense = jax.jit(lambda w: dequantize(w).astype(jnp.bfloat16))(w)
        packed_ws = [jax.tree.map(jnp.copy, w) for _ in range(max(1, math.ceil(256e6 / w.nbytes)))]
        dense_ws = [jnp.copy(dense) for _ in range(max(1, math.ceil(256e6 / (2 * n * k))))]
        backed_ws = [  # each form cycles over its own copies (>= 256 MB of either)
            DenseBacked(packed_ws[i % len(packed_ws)], dense_ws[i % len(dense_ws)])
            for i in range(max(len(packed_ws), len(dense_ws)))
        ]
        entry = {"shape": name, "format": fmt, "n": n, "k": k, "k_split": pick_config(n, k).k_split, "us": {}}
        if not args.no_bits:
            entry["same_bits"] = same_bits(w, k)
        for m in args.rows:
            x = jax.random.normal(jax.random.key(m), (m, k), jnp.float32).astype(jnp.bfloat16)
            times = {
                "gemm": timed_per_call(gemm, x, packed_ws),
                "dense": timed_per_call(invariant_matmul, x, dense_ws),
                "default": timed_per_call(default, x, backed_ws),
                "quantize": timed_per_call(quantize, x, packed_ws[:1]),
            }
            if m <= args.gemv_max_rows:
                times["gemv"] = timed_per_call(gemv, x, packed_ws)
            row = {key: round(seconds * 1e6, 2) for key, seconds in times.items()}
            best = min(times.get("gemv", math.inf), times["gemm"])
            row["best_over_dense"] = round(best / times["dense"], 3)
            row["best_over_default"] = round(best / times["default"], 3)
            if "gemv" in times:
                row["gemv_gb_s"] = round(w.nbytes / times["gemv"] / 1e9, 1)
            entry["us"][m] = row
        results.append(entry)
        bits = entry.get("same_bits", {})
        bad = [key for key, value in bits.items() if value is False]
        print(
            f"{name:13s} {fmt} n={n:6d} k={k:5d} same_bits={'-' if not bits else 'yes' if not bad else bad} "
            + " ".join(
                f"m{m}:{v.get('gemv', float('nan')):.1f}/{v['gemm']:.1f}/{v['dense']:.1f}/{v['default']:.1f}us"
                for m, v in entry["us"].items()
            ),
            flush=True,
        )
    print("columns: gemv / gemm / dense invariant matmul / default path, us per call")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
