"""Unrolled layers against one scanned layer body on XLA CPU: compile seconds and batch-1 step milliseconds.

    .venv/bin/python -m ember.tools.dev.probe_layer_scan [--layers 8] [--rows 1]

A layer here is the 1.5B Qwen's four fp32 projections (qkv 1536->2048, o 1536->1536, gate/up 1536->17920,
down 8960->1536) with an RMS norm and a residual: the bytes a decode step streams. "unrolled" reads each
layer's own arrays (what the generated plans do); "scan" runs jax.lax.scan over the same weights stacked
[layers, ...]; the question is whether XLA:CPU copies each layer's slice out of the stack before its dot
(which would add a write and a read of every weight per step).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

SHAPES = {"qkv": (1536, 2048), "o": (2048, 1536), "gate_up": (1536, 17920), "down": (8960, 1536)}


def layer(x, w):
    h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    a = (h @ w["qkv"]) @ w["o"]
    x = x + a
    gu = x @ w["gate_up"]
    g, u = jnp.split(gu, 2, axis=-1)
    return x + (jax.nn.silu(g) * u) @ w["down"]


def unrolled(x, layers):
    for w in layers:
        x = layer(x, w)
    return x


def scanned(x, stacked):
    return jax.lax.scan(lambda x, w: (layer(x, w), None), x, stacked)[0]


def timed(fn, args, repeats: int) -> dict:
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return {"compile_s": round(compile_s, 2), "min_ms": round(1e3 * min(times), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((args.rows, 1536), np.float32))
    stacked = {k: jnp.asarray(rng.standard_normal((args.layers, *s), np.float32) * 0.02) for k, s in SHAPES.items()}
    result = {"layers": args.layers, "rows": args.rows, "scan": timed(scanned, (x, stacked), args.repeats)}
    layers = [{k: v[i] for k, v in stacked.items()} for i in range(args.layers)]
    layers = jax.block_until_ready([{k: v + 0 for k, v in w.items()} for w in layers])  # own buffers
    del stacked
    result["unrolled"] = timed(unrolled, (x, layers), args.repeats)
    result["load_average"] = [round(v, 2) for v in __import__("os").getloadavg()]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
