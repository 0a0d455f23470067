"""Where a decode step's time goes on the GPU (run by hand on the device machine; JSON to stdout).

For a synthetic model and target, and each concurrency asked for, runs the engine (greedy,
ignore_eos) under the JAX profiler and reports:
- wall time per engine step, and the device's busy time per step (sum of kernel durations on the
  GPU's streams) — their gap is host overhead the GPU sits idle through;
- the kernels that took the most device time, by name, per step;
- the plan alone: the jitted step called back to back without reading results (device-bound time)
  and with a host read per step (what the synchronous engine loop pays).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import json
import os
import sys
import tempfile
import time

import numpy as np

TOP_KERNELS = 60  # names reported per run, by total device time


def _trace_planes(trace_dir: str) -> list:
    """Every XPlane of a jax.profiler trace folder (device planes "/device:GPU:i", host planes)."""
    from jax.profiler import ProfileData

    planes = []
    for path in glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True):
        with open(path, "rb") as f:
            planes.extend(ProfileData.from_serialized_xspace(f.read()).planes)
    return planes


def _device_kernels(planes: list) -> tuple[float, collections.Counter, collections.Counter]:
    """Sum of kernel time (ms) on the GPU planes, and per-kernel-name totals (ms) and counts."""
    totals, counts = collections.Counter(), collections.Counter()
    busy_ns = 0
    for plane in planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for event in line.events:
                busy_ns += event.duration_ns
                totals[event.name[:90]] += event.duration_ns / 1e6
                counts[event.name[:90]] += 1
    return busy_ns / 1e6, totals, counts


def _device_gaps(planes: list) -> dict:
    """Where the GPU sat idle between kernels (all streams merged) from the first kernel to the last: total idle
    time, how many gaps of each size, and the longest ones — host-bound stretches show as long gaps."""
    spans = sorted(
        (event.start_ns, event.end_ns)
        for plane in planes
        if plane.name.startswith("/device:GPU")
        for line in plane.lines
        if line.name.startswith("Stream")
        for event in line.events
    )
    gaps, reach = [], spans[0][1] if spans else 0
    for start, end in spans[1:]:
        if start > reach:
            gaps.append(start - reach)
        reach = max(reach, end)
    gaps_us = np.asarray(gaps, np.float64) / 1e3
    span_ms = (reach - spans[0][0]) / 1e6 if spans else 0.0
    return {
        "span_ms": round(span_ms, 2),
        "idle_ms": round(float(gaps_us.sum()) / 1e3, 2),
        "gaps_over_us": {str(t): int((gaps_us > t).sum()) for t in (5, 20, 100, 1000)},
        "idle_in_gaps_over_100us_ms": round(float(gaps_us[gaps_us > 100].sum()) / 1e3, 2),
        "longest_gaps_us": [round(float(g), 1) for g in np.sort(gaps_us)[::-1][:12]],
    }


def _host_launch_events(planes: list, per: int) -> list[dict]:
    """XLA's host-side thunk / launch / graph events (how a step reaches the GPU), counts per step, top 15."""
    counts = collections.Counter()
    for plane in planes:
        if plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            for event in line.events:
                if any(k in event.name for k in ("Thunk", "Launch", "Graph", "graph", "CommandBuffer", "cuda")):
                    counts[event.name[:70]] += 1
    return [{"name": name, "per_step": round(n / per, 2)} for name, n in counts.most_common(15)]


def _profile_engine(engine, vocab: int, concurrency: int, prompt_tokens: int, output_tokens: int) -> dict:
    import jax

    from ...runtime.sampling.params import SamplingParams

    rng = np.random.default_rng(concurrency)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_tokens)

    def run():
        prompts = [rng.integers(0, vocab, prompt_tokens).tolist() for _ in range(concurrency)]
        streams = [engine.submit(p, params) for p in prompts]
        for stream in streams:
            for _ in stream:
                pass

    run()  # compile this concurrency's shapes
    start = time.perf_counter()
    run()
    clean_wall = time.perf_counter() - start  # without the profiler's overhead
    trace_dir = tempfile.mkdtemp(prefix="ember-profile-")
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir):
        run()
    wall = time.perf_counter() - start
    planes = _trace_planes(trace_dir)
    busy_ms, totals, counts = _device_kernels(planes)
    steps = output_tokens  # about one step per generated token (prefills share steps with decodes)
    top = totals.most_common(TOP_KERNELS)
    return {
        "concurrency": concurrency,
        "unprofiled_wall_ms": round(clean_wall * 1e3, 1),
        "unprofiled_output_tok_s": round(concurrency * output_tokens / clean_wall, 1),
        "wall_ms": round(wall * 1e3, 1),
        "approx_steps": steps,
        "device_busy_ms": round(busy_ms, 1),
        "device_busy_fraction": round(busy_ms / (wall * 1e3), 3),
        "kernels_per_step": round(sum(counts.values()) / steps, 1),
        "device_ms_per_step": round(busy_ms / steps, 3),
        "device_gaps": _device_gaps(planes),
        "top_kernels_ms": [{"name": name, "ms": round(ms, 2), "calls": counts[name]} for name, ms in top],
    }


def context_batch(shape, context: int, block_size: int, num_blocks: int):
    """A decode-only StepBatch whose `shape.decode_rows` rows each see `context` tokens (positions 0 ..
    context - 1, the last one written this step) in blocks of their own (row r: blocks 1 + r * per_row ...;
    block 0 stays the padding rows' sink); context <= 1 is the padding batch. The values in those blocks are
    whatever the pool holds: the attention's work, not its answer, is what is timed."""
    from ...runtime.execution.step_inputs import padding_batch

    batch = padding_batch(shape)
    if context <= 1:
        return batch
    rows, kinds = shape.decode_rows, shape.num_kinds
    per_row = -(-context // block_size)
    if per_row > shape.table_blocks or 1 + rows * per_row > num_blocks:
        raise ValueError(
            f"{rows} rows of {context} tokens need {per_row} blocks each (table width "
            f"{shape.table_blocks}) and {1 + rows * per_row} in the pool ({num_blocks})"
        )
    tables = np.zeros((kinds, rows, shape.table_blocks), np.int32)
    tables[:, :, :per_row] = 1 + np.arange(rows * per_row, dtype=np.int32).reshape(rows, per_row)
    last = context - 1
    slots = np.zeros_like(batch.slots)
    slots[:, :rows] = tables[:, :, last // block_size] * block_size + last % block_size
    positions = batch.positions.copy()
    positions[:rows] = last
    return batch._replace(
        positions=positions, slots=slots, dec_block_tables=tables, dec_ctx_lens=np.full(rows, context, np.int32)
    )


def _plan_alone(engine, rows: int, context: int = 1, repeats: int = 50) -> dict:
    """The jitted step for `rows` decode rows at `context` tokens each (context_batch), called back to back
    (async) and with a host read per call; then `repeats` async calls under the profiler: kernels launched
    and device time per step."""
    import jax

    from ...runtime.execution.engine_step import pack_step_inputs, run_step
    from ...runtime.execution.step_inputs import StepShape

    ex = engine.executor
    shape = StepShape(rows, 0, ex.table_blocks, ex.num_kinds)
    batch = context_batch(shape, context, engine.kv.block_size, min(int(k.shape[0]) for k, _ in ex.kv))
    inputs = pack_step_inputs(batch, [], vocab_size=ex.vocab, num_rows=shape.logit_rows)

    def calls() -> None:
        out = None
        for _ in range(repeats):
            out, ex.kv = ex.step_fn(ex.model.dims, *inputs.static_args(), ex.model.params, ex.kv, inputs.buffer)
        jax.block_until_ready(out)

    calls()
    start = time.perf_counter()
    calls()
    async_ms = (time.perf_counter() - start) / repeats * 1e3
    start = time.perf_counter()
    for _ in range(repeats):
        result, ex.kv = run_step(
            ex.step_fn, ex.model.dims, ex.model.params, ex.kv, batch, [], vocab_size=ex.vocab, num_rows=shape.logit_rows
        )
    sync_ms = (time.perf_counter() - start) / repeats * 1e3
    trace_dir = tempfile.mkdtemp(prefix="ember-profile-plan-")
    with jax.profiler.trace(trace_dir):
        calls()
    planes = _trace_planes(trace_dir)
    busy_ms, totals, counts = _device_kernels(planes)
    host_events = _host_launch_events(planes, repeats)
    return {
        "device_gaps": _device_gaps(planes),
        "decode_rows": rows,
        "context": context,
        "async_ms_per_step": round(async_ms, 3),
        "sync_ms_per_step": round(sync_ms, 3),
        **_multi_alone(engine, shape, batch),
        "profiled_kernels_per_step": round(sum(counts.values()) / repeats, 1),
        "profiled_device_ms_per_step": round(busy_ms / repeats, 3),
        "top_kernels_us_per_step": [
            {"name": name, "us": round(ms * 1e3 / repeats, 2), "calls": round(counts[name] / repeats, 2)}
            for name, ms in totals.most_common(TOP_KERNELS)
        ],
        "host_launch_events_per_step": host_events,
    }


def _multi_alone(engine, shape, batch, calls: int = 10) -> dict:
    """The run-ahead executable (engine.executor.decode_steps steps per call, as the engine runs batch-1 decode):
    back-to-back calls (async) and with a host read per call, as ms per decode step."""
    import jax

    from ...runtime.execution.engine_step import launch_multi_step

    ex = engine.executor
    if ex.multi_step_fn is None:
        return {}
    slots = np.zeros((ex.decode_steps, shape.num_kinds, shape.decode_rows), np.int32)

    def call():
        packed, ex.kv, _ = launch_multi_step(
            ex.multi_step_fn,
            ex.model.dims,
            ex.model.params,
            ex.kv,
            batch,
            slots,
            [],
            vocab_size=ex.vocab,
            num_rows=shape.logit_rows,
        )
        return packed

    jax.block_until_ready(call())
    start = time.perf_counter()
    packed = [call() for _ in range(calls)]
    jax.block_until_ready(packed)
    async_ms = (time.perf_counter() - start) / (calls * ex.decode_steps) * 1e3
    start = time.perf_counter()
    for _ in range(calls):
        np.asarray(call())
    sync_ms = (time.perf_counter() - start) / (calls * ex.decode_steps) * 1e3
    return {
        "multi_steps_per_call": ex.decode_steps,
        "multi_async_ms_per_step": round(async_ms, 3),
        "multi_sync_ms_per_step": round(sync_ms, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="synthetic:qwen2.5-1.5b")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument(
        "--decode-steps",
        type=int,
        default=None,
        help="decode steps per device call when running ahead (default: the target's)",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=1,
        help="the plan alone's decode rows see this many tokens each (default 1: padding rows, "
        "whose attention reads nothing); needs --max-model-len >= it",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the engine's max_model_len (default: prompt + output tokens); sets the attention "
        "table width, hence its split count, as the bench's batch-1 engine (16,528) does",
    )
    parser.add_argument(
        "--plan-only", action="store_true", help="only the plan alone (no engine run): step time and kernels per step"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[""],
        metavar="FAMILY.FIELD=VALUE[,FAMILY.FIELD=VALUE]",
        help="kernel policy overrides (compiler/targets/policy.py), one engine each over the same loaded weights "
        "(an A/B in one process, e.g. norms.fused_quant=false norms.fused_quant=true)",
    )
    parser.add_argument("--kernel-policy", help="JSON file of overrides over the target's kernel policy (the base)")
    parser.add_argument("--deterministic", action="store_true", help="the engine in deterministic mode (its plans)")
    args = parser.parse_args(argv)

    from ...compiler.targets.policy import parse_assignments
    from ...runtime.engine.engine import Engine, EngineConfig
    from ..bench_models import load_bench_model

    model, tokenizer = load_bench_model(args.model, args.target, args.tokenizer, args.kernel_policy)
    context = args.prompt_tokens + args.output_tokens
    top = max(args.concurrency)
    context = max(context, args.max_model_len or 0, args.context)
    config = EngineConfig(
        num_blocks=top * (-(-context // 16) + 1) + 1,
        max_model_len=context,
        max_num_seqs=top,
        max_batched_tokens=512,
        enable_prefix_caching=False,
        decode_steps=args.decode_steps,
        deterministic=args.deterministic,
    )
    result = {
        "model": args.model,
        "target": args.target,
        "decode_steps": args.decode_steps,
        "deterministic": args.deterministic,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "runs": [],
        "plan_alone": [],
    }
    # the KV pools' dtype as `ember serve` reads it (EMBER_KV_CACHE_DTYPE)
    config = dataclasses.replace(config, kv_cache_dtype=os.environ.get("EMBER_KV_CACHE_DTYPE") or "auto")
    for variant in args.variants:
        # the policy each step of the engine built next is traced with (variants don't accumulate)
        policy = model.policy.overridden(parse_assignments(variant))
        engine = Engine(dataclasses.replace(model, policy=policy), tokenizer, config)
        try:
            for c in args.concurrency:
                if not args.plan_only:
                    result["runs"].append(
                        {
                            "variant": variant,
                            **_profile_engine(engine, int(model.dims.vocab), c, args.prompt_tokens, args.output_tokens),
                        }
                    )
                result["plan_alone"].append({"variant": variant, **_plan_alone(engine, c, args.context)})
        finally:
            engine.close()
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
