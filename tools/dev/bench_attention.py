"""Micro-benchmark: the split-K Triton decode attention kernel vs the reference decode path, on the GPU.

  JAX_PLATFORMS=cuda python tools/dev/bench_attention.py > docs/results/h200_decode_attention.json
  JAX_PLATFORMS=cuda python tools/dev/bench_attention.py --sweep --batches 1,32 --contexts 4096,32768

Cases: the Qwen2.5-1.5B (hq 12, hkv 2, dh 128) and Llama-3-8B (32/8/128) head shapes, B decode rows all at
context `ctx`, scattered blocks, bf16 pool. The table is ctx / block_size wide (the reference's cost follows
the table width, so this is its best case) unless --max-model-len widens it as an engine's would. Each timing is one jitted executable that calls the op
`--iters` times in a chain (each call's output is the next call's query: nothing can be hoisted or dropped),
divided by --iters: the per-call cost inside a step, launch included, dispatch amortized. Median of --reps.

Bytes: the K and V rows of every visible token plus q and the output; GB/s = bytes / time, and
`roofline` = that over --peak-gbps (H200 HBM3e spec 4800; ~3300-4300 measured copy bandwidth, DESIGN.md).
The reference is skipped (null) where its fp32 gather of the whole table would pass --ref-limit-gb.
--sweep also times forced split counts and alternative launch configs and reports each case's best.
JSON to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict

import jax
import jax.numpy as jnp

from ember.compiler.kernels.attention.decode import DecodeAttentionConfig, decode_launch_plan, paged_decode_attention
from ember.compiler.kernels.attention.reference import _attend, _gather, _table_slots

MODELS = {"qwen2.5-1.5b": (12, 2, 128), "llama-3-8b": (32, 8, 128)}
SWEEP_SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)
SWEEP_CONFIGS = [
    DecodeAttentionConfig(block_n=n, num_warps=w, num_stages=s)
    for n in (32, 64, 128)
    for w in (4, 8)
    for s in (2, 3, 4)
]


def _log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def make_inputs(
    hq: int, hkv: int, dh: int, batch: int, ctx: int, block_size: int, dtype, seed: int = 0, max_model_len: int = 0
):
    """Rows at context ctx; the table is max(ctx, max_model_len) / block_size wide (entries past a row's
    blocks hold block 0, as the runtime pads them)."""
    used = -(-ctx // block_size)
    width = max(used, -(-max_model_len // block_size))
    num_blocks = 1 + batch * used
    key_q, key_pool, key_perm = jax.random.split(jax.random.key(seed), 3)
    # the values do not change the timing: a random base of up to 4096 blocks, repeated (a 30 GB normal
    # draw would need its fp32 temporaries too)
    base = jax.random.normal(key_pool, (2, min(num_blocks, 4096), block_size, hkv, dh), jnp.float32).astype(dtype)
    reps = jnp.arange(num_blocks) % base.shape[1]
    k_pool, v_pool = base[0][reps], base[1][reps]
    tables = (1 + jax.random.permutation(key_perm, batch * used)).reshape(batch, used).astype(jnp.int32)
    tables = jnp.pad(tables, ((0, 0), (0, width - used)))
    ctx_lens = jnp.full((batch,), ctx, jnp.int32)
    q = jax.random.normal(key_q, (batch, hq, dh), jnp.float32).astype(dtype)
    return q, k_pool, v_pool, tables, ctx_lens


def reference_decode(q, k_pool, v_pool, tables, ctx_lens, *, scale):
    # the decode half of attention.paged_attention (the table's every block, gathered, fp32 einsum + softmax)
    slots = _table_slots(tables, k_pool.shape[1])
    pos = ctx_lens - 1
    return _attend(q[:, None], _gather(k_pool, slots), _gather(v_pool, slots), pos[:, None], jnp.int32(0), scale)[:, 0]


def time_chain(fn, inputs, iters: int, reps: int) -> float:
    """µs per call of fn(q, pools...) chained `iters` times in one executable (median of `reps`)."""

    @jax.jit
    def chain(q, *rest):
        for _ in range(iters):  # unrolled: a device while loop would sync with the host every iteration
            q = fn(q, *rest).astype(q.dtype)
        return q

    chain(*inputs).block_until_ready()  # compile + warm
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        chain(*inputs).block_until_ready()
        times.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(times)


BACKEND = "triton"  # --backend emulate: the jnp emulation (a CPU smoke run of this script)


def kernel_fn(scale, config, splits):
    return lambda q, k, v, t, c: paged_decode_attention(
        q, k, v, t, c, c - 1, 0, scale=scale, backend=BACKEND, config=config, splits=splits
    )


def bench_case(model: str, batch: int, ctx: int, args) -> dict:
    hq, hkv, dh = MODELS[model]
    dtype = jnp.dtype(args.dtype)
    inputs = make_inputs(hq, hkv, dh, batch, ctx, args.block_size, dtype, max_model_len=args.max_model_len)
    scale = 1.0 / math.sqrt(dh)
    config = DecodeAttentionConfig()
    width = inputs[3].shape[1]
    plan = decode_launch_plan(batch, hq, hkv, dh, args.block_size, width, dot_fp32=dtype == jnp.float32, config=config)
    kv_bytes = 2 * batch * ctx * hkv * dh * dtype.itemsize
    moved = kv_bytes + 2 * batch * hq * dh * dtype.itemsize
    kernel_us = time_chain(kernel_fn(scale, config, None), inputs, args.iters, args.reps)
    row = dict(
        model=model,
        hq=hq,
        hkv=hkv,
        dh=dh,
        batch=batch,
        context=ctx,
        table_tokens=width * args.block_size,
        block_size=args.block_size,
        dtype=dtype.name,
        splits=plan["splits"],
        kernel_us=round(kernel_us, 2),
        bytes=moved,
        kernel_gbps=round(moved / kernel_us / 1e3, 1),
        roofline=round(moved / kernel_us / 1e3 / args.peak_gbps, 3),
    )
    gathered = 2 * batch * width * args.block_size * hkv * dh * 4
    if gathered <= args.ref_limit_gb * 1e9:
        ref = jax.jit(lambda *a: reference_decode(*a, scale=scale))
        ref_us = time_chain(lambda *a: reference_decode(*a, scale=scale), inputs, args.iters, args.reps)
        got = jax.jit(kernel_fn(scale, config, None))(*inputs).astype(jnp.float32)
        want = ref(*inputs).astype(jnp.float32)
        row.update(
            reference_us=round(ref_us, 2),
            speedup=round(ref_us / kernel_us, 2),
            reference_gbps=round(moved / ref_us / 1e3, 1),
            max_abs_err=float(jnp.max(jnp.abs(got - want))),
            max_abs_ref=float(jnp.max(jnp.abs(want))),
        )
    else:
        row.update(reference_us=None, speedup=None, reference_gbps=None, max_abs_err=None)
    if args.sweep:
        row["sweep"] = sweep(inputs, scale, plan, args)
        best = min(row["sweep"], key=lambda r: r["us"])
        row["best"] = dict(best, gbps=round(moved / best["us"] / 1e3, 1))
    del inputs
    return row


def sweep(inputs, scale, plan, args) -> list[dict]:
    rows = []
    max_splits = -(-inputs[3].shape[1] * args.block_size // 64)
    for splits in (s for s in SWEEP_SPLITS if s <= max_splits):
        us = time_chain(kernel_fn(scale, DecodeAttentionConfig(), splits), inputs, args.iters, args.reps)
        rows.append(dict(splits=splits, **_knobs(DecodeAttentionConfig()), us=round(us, 2)))
    best_splits = min(rows, key=lambda r: r["us"])["splits"]
    for config in SWEEP_CONFIGS:
        if config == DecodeAttentionConfig():
            continue
        try:
            us = time_chain(kernel_fn(scale, config, best_splits), inputs, args.iters, args.reps)
        except Exception as error:  # e.g. shared memory exceeded: record, go on
            rows.append(dict(splits=best_splits, **_knobs(config), us=float("inf"), error=str(error)[:200]))
            continue
        rows.append(dict(splits=best_splits, **_knobs(config), us=round(us, 2)))
    return rows


def _knobs(config: DecodeAttentionConfig) -> dict:
    return {k: v for k, v in asdict(config).items() if k in ("block_n", "num_warps", "num_stages")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,32,256")
    parser.add_argument("--contexts", default="128,4096,16384,32768")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=0,
        help="table width in tokens (an engine's max context); default: each case's context",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--peak-gbps", type=float, default=4800.0)
    parser.add_argument("--ref-limit-gb", type=float, default=24.0)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--backend", default="triton", choices=["triton", "emulate"])
    args = parser.parse_args(argv)
    global BACKEND
    BACKEND = args.backend
    if jax.default_backend() != "gpu" and args.backend == "triton":
        _log("needs an NVIDIA GPU: run with JAX_PLATFORMS=cuda")
        return 2
    results = []
    for model in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            for ctx in map(int, args.contexts.split(",")):
                row = bench_case(model, batch, ctx, args)
                _log(json.dumps({k: v for k, v in row.items() if k != "sweep"}))
                results.append(row)
    print(
        json.dumps(
            dict(
                device=str(jax.devices()[0].device_kind),
                jax=jax.__version__,
                backend=BACKEND,
                default_config=asdict(DecodeAttentionConfig()),
                args=vars(args),
                results=results,
            ),
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
