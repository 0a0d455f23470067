"""What one kernel launch costs inside a jitted step on the GPU (run by hand on the device machine).

Times, per call, N back-to-back calls inside ONE executable (as a decode step runs its projections):
  triton_noop   a Triton kernel of one program that writes one value
  triton_copy   a Triton kernel streaming `--copy-mb` MB (many programs)
each launched as compiler/kernels/triton/launch.py launches every Triton kernel: a native XLA kernel (XLA's Triton
pipeline; `xla_triton_*`)
  xla_tiny      a tiny XLA dot ([1, 64] x [64, 64]) per call, each on its own weight
  xla_copy      XLA reading and scaling the same `--copy-mb` MB per call
The difference between a kernel's measured time and its bytes / bandwidth is the fixed cost a small
decode projection pays. Each is timed twice: the executable returning one array per call (as
tools/dev/bench_quant_matmul.py does), and returning one small stacked array (`_single_output`), which
separates per-output host bookkeeping from the GPU's own per-kernel cost. Prints JSON (and writes $OUT/launch_overhead.json).

  python tools/dev/probe_launch_overhead.py [--calls 64] [--copy-mb 1] [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from ember.compiler.kernels.triton.launch import triton_call


@triton.jit
def _noop_kernel(x_ptr, out_ptr):
    tl.store(out_ptr, tl.load(x_ptr) + 1.0)


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)


def triton_noop(x):
    return triton_call(x, kernel=_noop_kernel, out_shape=jax.ShapeDtypeStruct((1,), x.dtype), grid=(1,))


def triton_copy(x, block: int = 4096):
    n = x.shape[0]
    return triton_call(
        x,
        kernel=_copy_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(triton.cdiv(n, block),),
        n=n,
        BLOCK=block,
    )


def per_call_seconds(fn, inputs: list, runs: int, single_output: bool = False) -> float:
    """single_output: the executable returns one small array (each call's first value, stacked) instead
    of one array per call, so per-output host bookkeeping is not counted."""
    if single_output:
        many = jax.jit(lambda xs: jnp.stack([fn(x).reshape(-1)[0] for x in xs]))
    else:
        many = jax.jit(lambda xs: [fn(x) for x in xs])
    for _ in range(3):
        jax.block_until_ready(many(inputs))
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(many(inputs))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) / len(inputs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--copy-mb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    n = int(args.copy_mb * 2**20) // 4
    key = jax.random.PRNGKey(0)
    scalars = [jnp.full((1,), float(i), jnp.float32) for i in range(args.calls)]
    vectors = [jax.random.normal(jax.random.fold_in(key, i), (n,), jnp.float32) for i in range(args.calls)]
    weights = [jax.random.normal(jax.random.fold_in(key, 1000 + i), (64, 64), jnp.float32) for i in range(args.calls)]
    row = jnp.ones((1, 64), jnp.float32)
    results = {
        "device": str(jax.devices()[0]),
        "calls_per_executable": args.calls,
        "copy_mb": args.copy_mb,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    for suffix, single in (("", False), ("_single_output", True)):
        results.update(
            {
                f"xla_triton_noop_us{suffix}": per_call_seconds(triton_noop, scalars, args.runs, single) * 1e6,
                f"xla_triton_copy_us{suffix}": per_call_seconds(triton_copy, vectors, args.runs, single) * 1e6,
                f"xla_tiny_dot_us{suffix}": per_call_seconds(lambda w: row @ w, weights, args.runs, single) * 1e6,
                f"xla_copy_us{suffix}": per_call_seconds(lambda v: v * 2.0, vectors, args.runs, single) * 1e6,
            }
        )
    print(json.dumps(results, indent=1))
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "launch_overhead.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
