"""The batch-invariant matmul (compiler/kernels/invariant_matmul/) on the GPU: for each projection shape, whether
a row's bits are the same at every row count and in both forms (splits as programs / splits in one program),
and its time against XLA's GEMM (cuBLAS) on the same operands, per call. Prints a table; --out writes JSON.

  python -m ember.tools.dev.bench_invariant_matmul [--out FILE] [--rows 1 32 4096]

Timing: each pass runs the call over enough weight copies to pass 256 MB (so weights stream from HBM, not L2),
passes chained through their outputs inside one executable, long minus short loop (tools/hbm_probe.py).
"""

from __future__ import annotations

import argparse
import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.invariant_matmul.config import pick_config
from ember.compiler.kernels.invariant_matmul.matmul import invariant_matmul
from ember.tools.hbm_probe import median_run_seconds, pass_loop

# (name, n, k): the 1.5B's and the 8B's projections
SHAPES = (
    ("1.5b qkv", 2048, 1536),
    ("1.5b o", 1536, 1536),
    ("1.5b gate_up", 17920, 1536),
    ("1.5b down", 1536, 8960),
    ("1.5b head", 151936, 1536),
    ("8b qkv", 6144, 4096),
    ("8b o", 4096, 4096),
    ("8b gate_up", 28672, 4096),
    ("8b down", 4096, 14336),
)
INVARIANCE_ROWS = (1, 2, 3, 8, 16, 17, 64, 255, 256, 257, 1024, 4096)


def invariance(n: int, k: int) -> dict:
    key = jax.random.key(n * 31 + k)
    x = jax.random.normal(key, (4096, k), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(jax.random.fold_in(key, 1), (n, k), jnp.float32) * 0.05).astype(jnp.bfloat16)
    f = jax.jit(invariant_matmul, static_argnames="split_form")
    full = np.asarray(f(x, w, split_form=False)).astype(np.float32)
    split = np.asarray(f(x[:256], w, split_form=True)).astype(np.float32)
    ok = {"forms": bool(np.array_equal(split, full[:256]))}
    for m in INVARIANCE_ROWS:
        got = np.asarray(f(x[:m], w)).astype(np.float32)
        ok[m] = bool(np.array_equal(got, full[:m]))
    ref = np.asarray(x[:64].astype(jnp.float32)) @ np.asarray(w.astype(jnp.float32)).T
    ok["rel_err"] = float(np.abs(full[:64] - ref).max() / np.abs(ref).max())
    return ok


def timed_per_call(fn, x, weights, short: int = 2, long: int = 5, runs: int = 3) -> float:
    """Seconds of one fn(x, w) call over `weights` (copies of one weight, enough bytes to stream from HBM)."""

    def step(operands, carry):
        x, ws = operands
        y = None if carry is None else carry
        for w in ws:
            xin = x if y is None else x + (y[0, 0] * 0).astype(x.dtype)
            y = fn(xin, w)
        return y

    loop = pass_loop(step)
    median = lambda passes: median_run_seconds(lambda: jax.block_until_ready(loop((x, weights), passes)), runs)  # noqa: E731
    return max(median(long) - median(short), 1e-9) / (long - short) / len(weights)


def seconds_per_call(fn, n: int, k: int, m: int) -> float:
    copies = max(1, math.ceil(256e6 / (2 * n * k)))
    key = jax.random.key(m)
    ws = [
        (jax.random.normal(jax.random.fold_in(key, i), (n, k), jnp.float32) * 0.05).astype(jnp.bfloat16)
        for i in range(copies)
    ]
    x = jax.random.normal(key, (m, k), jnp.float32).astype(jnp.bfloat16)
    return timed_per_call(fn, x, ws)


def write_results(path: str | None, results: list) -> None:
    """The results as JSON under the device's name (nothing without a path)."""
    if path:
        with open(path, "w") as fh:
            json.dump({"device": jax.devices()[0].device_kind, "results": results}, fh, indent=1)


def xla_matmul(x, w):
    return jnp.einsum("mk,nk->mn", x, w)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32, 4096])
    parser.add_argument("--out")
    args = parser.parse_args()
    results = []
    for name, n, k in SHAPES:
        config = pick_config(n, k)
        entry = {
            "shape": name,
            "n": n,
            "k": k,
            "block_n": config.block_n,
            "k_split": config.k_split,
            "invariant": invariance(n, k),
            "us": {},
        }
        for m in args.rows:
            ours = seconds_per_call(invariant_matmul, n, k, m)
            xla = seconds_per_call(xla_matmul, n, k, m)
            entry["us"][m] = {
                "invariant": round(ours * 1e6, 2),
                "xla": round(xla * 1e6, 2),
                "xla_over_invariant": round(xla / ours, 3),
                "invariant_gb_s": round(2 * n * k / ours / 1e9, 1),
            }
        results.append(entry)
        inv = entry["invariant"]
        bad = [key for key, value in inv.items() if value is False]
        print(
            f"{name:14s} n={n:6d} k={k:5d} split={config.k_split:5d} invariant={'yes' if not bad else bad} "
            f"err={inv['rel_err']:.1e} "
            + " ".join(
                f"m{m}:{v['invariant']:.1f}/{v['xla']:.1f}us({v['xla_over_invariant']:.2f})"
                for m, v in entry["us"].items()
            ),
            flush=True,
        )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
