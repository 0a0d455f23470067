"""Micro-benchmark of prefill_attention (the Triton chunk kernel) against the reference on the GPU.

For hq/hkv/dh in {12/2/128 (Qwen2.5-1.5B), 32/8/128 (Llama-3-8B)}, chunks of 512 and 4096 tokens after a
cached prefix of 0 and 12,288 tokens (plus 16- and 64-token chunks after 12,288, where the KV split matters),
bf16, 16-token pages, times in one run:
  kernel     prefill_attention (jax-triton), its default launch config (pick_config + launch_plan)
  kernel_s1  the same with kv_splits=1, where the default splits KV (what the split buys)
  reference  attention.paged_attention's prefill branch: gather the table, fp32 scores [hkv, G, C, S]
             (skipped when its scores would pass REFERENCE_LIMIT_BYTES)
Each as µs per call and TFLOP/s of useful work (4 * dh * hq per visible (query, key) pair: the causal
triangle plus the prefix), the kernel's max |error| against the reference, and the ratio reference / kernel.

Timing: one executable chains `calls` calls (the output is the next call's q, so they run back to back
and the tens of µs of dispatch are spread over them); a call's time is the median of `runs` runs / calls.

  JAX_PLATFORMS=cuda python tools/dev/bench_prefill_attention.py [--sweep] [--runs 7] > prefill_bench.json
--sweep also times SWEEP_CONFIGS (with and without the KV split) at the 512- and 4096-token chunks and reports
each and the best (what pick_config and launch_plan's split rule should say); about 100 compiles, ~5-8 min.
Progress goes to stderr, one JSON line per case.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from ember.compiler.kernels.attention.flops import useful_flops
from ember.compiler.kernels.attention.prefill import (
    PrefillAttentionConfig,
    launch_plan,
    pick_config,
    prefill_attention,
)
from ember.compiler.kernels.attention.reference import _attend

SHAPES = ((12, 2, 128), (32, 8, 128))  # (hq, hkv, dh)
# (chunk, prefix, table width in blocks: None = just the context; 2048 = an engine with a 32k context, whose
# table width decides the KV split (launch_plan) whatever the prefix is)
CASES = (
    (512, 0, None),
    (512, 12288, None),
    (4096, 0, None),
    (4096, 12288, None),
    (16, 12288, None),
    (64, 12288, None),
    (512, 0, 2048),
    (64, 0, 2048),
)
PAGE = 16
REFERENCE_LIMIT_BYTES = 24 << 30  # fp32 scores of the reference; XLA holds ~3 such buffers
TARGET_RUN_S = 0.02  # calls per run: enough to make a run last about this long
SWEEP_CONFIGS = tuple(
    PrefillAttentionConfig(block_m=m, block_n=n, num_warps=w, num_stages=s)
    for m, n, w, s in (
        (128, 64, 8, 3),
        (128, 64, 8, 2),
        (128, 64, 4, 3),
        (128, 128, 8, 3),
        (128, 128, 8, 2),
        (128, 32, 8, 3),
        (64, 64, 4, 3),
        (64, 128, 4, 3),
    )
)


def make_inputs(hq, hkv, dh, chunk, prefix, width=None, dtype=jnp.bfloat16, seed=0):
    """A pool holding the sequence's prefix + chunk in shuffled blocks (block 0 spare), its table (`width`
    blocks, padded with block 0 past the context, as the engine's), the chunk's queries and positions."""
    used = -(-(prefix + chunk) // PAGE)
    keys = jax.random.split(jax.random.key(seed), 4)
    shape = (used + 1, PAGE, hkv, dh)
    k_pool = jax.random.normal(keys[0], shape, jnp.float32).astype(dtype)
    v_pool = jax.random.normal(keys[1], shape, jnp.float32).astype(dtype)
    table = (jax.random.permutation(keys[2], used) + 1).astype(jnp.int32)
    table = jnp.pad(table, (0, max(0, (width or used) - used)))
    q = jax.random.normal(keys[3], (chunk, hq, dh), jnp.float32).astype(dtype)
    positions = prefix + jnp.arange(chunk, dtype=jnp.int32)
    return q, k_pool, v_pool, table, positions


def reference_prefill(q, k_pool, v_pool, table, positions, window, *, scale):
    # what paged_attention does for the chunk rows: gather the whole table, then the fp32 reference
    _, page, hkv, dh = k_pool.shape
    slots = (table[:, None] * page + jnp.arange(page, dtype=jnp.int32)).reshape(-1)
    keys, values = k_pool[slots // page, slots % page], v_pool[slots // page, slots % page]
    return _attend(q[None], keys[None], values[None], positions[None], window, scale)[0]


def time_per_call(fn, q, rest, runs: int) -> tuple[float, int]:
    """(µs per call, calls per run) for fn(q, *rest) -> same shape as q, chained in one executable."""
    chained = jax.jit(lambda n, q, *rest: jax.lax.fori_loop(0, n, lambda i, x: fn(x, *rest), q))
    jax.block_until_ready(chained(1, q, *rest))  # compile + warm up
    t0 = time.perf_counter()
    jax.block_until_ready(chained(2, q, *rest))
    calls = int(min(256, max(2, TARGET_RUN_S / max((time.perf_counter() - t0) / 2, 1e-6))))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(chained(calls, q, *rest))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / calls * 1e6, calls


def kernel_fn(scale, config=None):
    return functools.partial(prefill_attention, num_tokens=None, window=0, scale=scale, config=config)


def bench(sweep: bool = False, runs: int = 7) -> dict:
    if jax.default_backend() != "gpu":
        raise SystemExit("needs an NVIDIA GPU: run with JAX_PLATFORMS=cuda")
    results = []
    for hq, hkv, dh in SHAPES:
        scale = dh**-0.5
        for chunk, prefix, width in CASES:
            q, k_pool, v_pool, table, positions = make_inputs(hq, hkv, dh, chunk, prefix, width)
            rest = (k_pool, v_pool, table, positions)
            flops = useful_flops(chunk, prefix, 0, hq, dh)
            config = pick_config(dh, q.dtype)
            plan = launch_plan(chunk, hq, hkv, dh, PAGE, table.shape[0], scale=scale, config=config)
            row = dict(
                hq=hq,
                hkv=hkv,
                dh=dh,
                chunk=chunk,
                prefix=prefix,
                table_blocks=int(table.shape[0]),
                dtype="bfloat16",
                page=PAGE,
                gflop=round(flops / 1e9, 3),
                config=dataclasses.asdict(config),
                grid=list(plan.grid),
            )
            kernel = kernel_fn(scale)
            us, calls = time_per_call(lambda x, *r: kernel(x, *r), q, rest, runs)
            row.update(kernel_us=round(us, 2), kernel_tflops=round(flops / us / 1e6, 1), calls=calls)
            if plan.splits > 1:
                single = kernel_fn(scale, dataclasses.replace(config, kv_splits=1))
                us1, _ = time_per_call(lambda x, *r: single(x, *r), q, rest, runs)
                row.update(kernel_s1_us=round(us1, 2), kernel_s1_tflops=round(flops / us1 / 1e6, 1))
            score_bytes = 4 * hq * chunk * table.shape[0] * PAGE
            if score_bytes <= REFERENCE_LIMIT_BYTES:
                ref = functools.partial(reference_prefill, window=0, scale=scale)
                got = jax.jit(kernel)(q, *rest).astype(jnp.float32)
                expected = jax.jit(ref)(q, *rest).astype(jnp.float32)
                row["max_abs_err"] = float(jnp.max(jnp.abs(got - expected)))
                ref_us, _ = time_per_call(lambda x, *r: ref(x, *r), q, rest, max(3, runs // 2))
                row.update(
                    reference_us=round(ref_us, 2),
                    reference_tflops=round(flops / ref_us / 1e6, 1),
                    speedup=round(ref_us / us, 2),
                )
            else:
                row["reference"] = f"skipped: fp32 scores of {score_bytes / 2**30:.0f} GiB"
            if sweep and chunk >= 512 and width is None:  # (the short chunks only show what the KV split buys)
                row["sweep"] = sweep_case(q, rest, flops, scale, runs)
                row["best"] = min(row["sweep"], key=lambda r: r.get("us", float("inf")))
            print(json.dumps({k: v for k, v in row.items() if k != "sweep"}), file=sys.stderr, flush=True)
            results.append(row)
    return {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "results": results}


def sweep_case(q, rest, flops, scale, runs) -> list[dict]:
    out = []
    for config in SWEEP_CONFIGS:
        for splits in (None, 1):
            candidate = dataclasses.replace(config, kv_splits=splits)
            entry = dict(config=dataclasses.asdict(candidate))
            try:
                fn = kernel_fn(scale, candidate)
                us, _ = time_per_call(lambda x, *r: fn(x, *r), q, rest, max(3, runs // 2))
                entry.update(us=round(us, 2), tflops=round(flops / us / 1e6, 1))
            except Exception as error:  # e.g. out of shared memory: report, keep sweeping
                entry["error"] = str(error).splitlines()[0][:200]
            out.append(entry)
            plan = launch_plan(
                q.shape[0],
                q.shape[1],
                rest[0].shape[2],
                q.shape[2],
                PAGE,
                rest[2].shape[0],
                scale=scale,
                config=dataclasses.replace(config, kv_splits=None),
            )
            if plan.splits == 1:
                break  # the default does not split here: kv_splits=1 is the same kernel
    return out


if __name__ == "__main__":
    print(
        json.dumps(
            bench(
                sweep="--sweep" in sys.argv[1:],
                runs=int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 7,
            ),
            indent=1,
        )
    )
