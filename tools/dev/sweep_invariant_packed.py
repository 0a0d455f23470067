"""Launch configs of the batch-invariant matmul (compiler/kernels/invariant_matmul/) on packed GGUF weights or
(--form dense) on their bf16 copies: per projection and config variant (block_n, num_warps, k_split, block_k), the
time per call at a few row counts, and whether its bits equal the dense copy's under the weight's default config
(pick_config) — a variant that keeps them may serve some row counts beside the default config at others. Prints a
line per variant; --out writes JSON.

  python -m ember.tools.dev.sweep_invariant_packed [--form packed|dense] [--rows 1 64] [--shapes "1.5b down"] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.gguf_gemv import pack, random_gguf_bytes
from ember.compiler.kernels.gguf_gemv.reference import dequantize
from ember.compiler.kernels.invariant_matmul.config import pick_config
from ember.compiler.kernels.invariant_matmul.matmul import invariant_matmul

from .bench_invariant_matmul import timed_per_call, write_results
from .bench_invariant_packed import SHAPES

VARIANTS = [
    dict(block_n=block_n, num_warps=warps, k_split=k_split, block_k=block_k)
    for block_n, warps, k_split, block_k in itertools.product((32, 64, 128), (4, 8), (None, 256), (64, 128))
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--form", choices=("packed", "dense"), default="packed", help="the weight the variants read")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--shapes", nargs="+", default=["1.5b"], help="shapes whose name starts with one of these")
    parser.add_argument("--out")
    args = parser.parse_args()
    results = []
    for name, fmt, n, k in SHAPES:
        if not name.startswith(tuple(args.shapes)):
            continue
        w = jax.device_put(
            pack(random_gguf_bytes(np.random.default_rng(n + k), fmt, (n, k), realistic=True), fmt, (n, k))
        )
        dense = jax.jit(lambda w: dequantize(w).astype(jnp.bfloat16))(w)
        read = w if args.form == "packed" else dense
        ws = [jax.tree.map(jnp.copy, read) for _ in range(max(1, math.ceil(256e6 / read.nbytes)))]
        x = jax.random.normal(jax.random.key(k), (max(args.rows), k), jnp.float32).astype(jnp.bfloat16)
        base = pick_config(n, k)
        want = np.asarray(jax.jit(invariant_matmul)(x, dense).astype(jnp.float32))
        for variant in VARIANTS:
            fields = {key: value for key, value in variant.items() if value is not None}
            config = dataclasses.replace(base, **fields)
            if config.k_split % config.block_k:
                continue
            f = jax.jit(lambda x, w, config=config: invariant_matmul(x, w, config=config))
            try:
                same = all(np.array_equal(np.asarray(f(x[:m], read).astype(jnp.float32)), want[:m]) for m in args.rows)
                us = {m: round(timed_per_call(f, x[:m], ws) * 1e6, 2) for m in args.rows}
            except Exception as error:  # a config Triton cannot lower (shared memory, registers)
                print(f"{name} {fields}: {type(error).__name__}", flush=True)
                continue
            results.append(
                {
                    "shape": name,
                    "format": fmt,
                    "form": args.form,
                    "config": dataclasses.asdict(config),
                    "same_bits": same,
                    "us": us,
                }
            )
            print(
                f"{name:13s} {fmt} {fields} same_bits={same} " + " ".join(f"m{m}:{t:.1f}us" for m, t in us.items()),
                flush=True,
            )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
