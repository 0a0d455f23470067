"""The rows-variant sweep of tools/dev/bench_quant_matmul.py (`--rows-sweep`; run by hand on the GPU).

For every (format, decode shape, m <= 4) case: the split kernel's default config, the rows default
(config.py's ROWS_RULES) and rows_candidates() — row tiles 4..64, split-K 1..8, 1..4 super-blocks per
step, 1..8 warps, ~10-20 distinct launch plans per case — each timed as bench_quant_matmul times a
kernel (one executable of back-to-back calls on distinct weight copies, median of --runs). Each case's
executables are lowered one by one (the Triton IR is made under the GIL) and compiled by XLA in
parallel threads, which is most of the sweep's time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.gguf_gemv import pick_config
from ember.compiler.kernels.gguf_gemv.config import QuantMatmulConfig
from ember.compiler.kernels.gguf_gemv.matmul import launch_plan
from ember.tools.dev import bench_quant_matmul as bench
from ember.tools.dev.bench_quant_matmul import (
    DECODE_SHAPES,
    copies_for,
    kernel_fn,
    max_rel_err,
    random_weight,
    replicate,
)
from ember.tools.hbm_probe import median_run_seconds


def rows_candidates(fmt: str, m: int, out: int, inner: int) -> list[QuantMatmulConfig]:
    """~10-20 rows-variant configs for one case, distinct launch plans: row tiles 4..64, for each the
    smallest split_k (1..8) giving >= 4 programs per SM and the next one, and (sb_per_step, num_warps)
    pairs that give ~4-16 fp32 accumulators per thread per activation row (fewer at m = 4: registers)."""
    unit_w = 16 if fmt == "q6_k" else 32  # accumulator width per unit and row
    per_sb = 8 if fmt in ("q8_0", "q5_0") else 1  # Q8_0 / Q5_0: 8 blocks per sb_per_step
    units = inner // (32 if fmt in ("q8_0", "q5_0") else 256)
    targets = (8, 16) if m == 1 else (4, 8)
    seen, found = set(), []
    for bn in (4, 8, 16, 32, 64):
        tiles = -(-out // bn)
        splits = [k for k in (1, 2, 4, 8) if k <= units]
        first = next((i for i, k in enumerate(splits) if tiles * k >= 4 * 132), len(splits) - 1)
        for split in splits[first : first + 2]:
            if tiles * split > 132 * 64:
                continue
            for acc in targets:
                for sb in (1, 2, 4):
                    warps = per_sb * sb * bn * unit_w // (32 * acc)
                    if warps not in (1, 2, 4, 8):
                        continue
                    config = QuantMatmulConfig(
                        variant="rows", block_n=bn, split_k=split, sb_per_step=sb, num_warps=warps, num_stages=1
                    )
                    plan = launch_plan(fmt, m, out, inner, config)
                    key = (plan["grid"], tuple(sorted(plan["meta"].items())), warps)
                    if key not in seen:
                        seen.add(key)
                        found.append(config)
                    break
    return found


def compiled_calls(fn, x, weights: list):
    """The lowered (not yet compiled) executable of `len(weights)` back-to-back calls fn(x, w)."""
    return jax.jit(lambda x, ws: [fn(x, w) for w in ws]).lower(x, weights)


def time_executable(exe, x, weights: list, runs: int) -> float:
    """Median seconds per call of a compiled compiled_calls executable."""
    return median_run_seconds(lambda: jax.block_until_ready(exe(x, weights)), runs) / len(weights)


def rows_sweep_case(fmt, shape, m, x, weights, nbytes, runs, bandwidth) -> dict:
    """Time the split kernel's default, the rows default and rows_candidates() for one case. Executables are
    lowered one by one (Triton IR, under the GIL) and compiled by XLA in parallel threads."""
    from concurrent.futures import ThreadPoolExecutor

    from ember.compiler.targets.policy import overriding

    with overriding({"quant_gemv.rows_for_decode": False}):
        split_default = pick_config(fmt, m, *shape)
    with overriding({"quant_gemv.rows_for_decode": True}):
        rows_default = pick_config(fmt, m, *shape)
    entries = [("split_default", split_default), ("rows_default", rows_default)]
    entries += [("candidate", c) for c in rows_candidates(fmt, m, *shape) if c != rows_default]
    lowered, results = [], []
    for label, config in entries:
        info = {"label": label, "config": dataclasses.asdict(config)}
        try:
            info["split_k"] = launch_plan(fmt, m, *shape, config)["split_k"]
            lowered.append((info, config, compiled_calls(kernel_fn(config), x, weights)))
        except Exception as error:
            info["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        results.append(info)
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        futures = [(info, config, pool.submit(low.compile)) for info, config, low in lowered]
        for info, _config, future in futures:
            try:
                seconds = time_executable(future.result(), x, weights, runs)
            except Exception as error:
                info["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                continue
            info.update(
                us=round(seconds * 1e6, 2),
                gb_s=round(nbytes / seconds / 1e9, 1),
                frac_copy=round(nbytes / seconds / 1e9 / bandwidth, 3),
            )
    timed = sorted((r for r in results if "us" in r and r["label"] != "split_default"), key=lambda r: r["us"])
    case = {
        "format": fmt,
        "out": shape[0],
        "in": shape[1],
        "m": m,
        "weight_bytes": nbytes,
        "calls": len(weights),
        "results": results,
    }
    by_label = {r["label"]: r for r in results}
    for key in ("split_default", "rows_default"):
        case[key] = by_label[key]
    if timed:
        case["best"] = best = timed[0]
        for r in {id(r): r for r in (best, by_label["rows_default"], by_label["split_default"])}.values():
            if "us" in r:
                try:
                    r["max_rel_err_vs_reference"] = max_rel_err(x, weights[0], QuantMatmulConfig(**r["config"]))
                except Exception as error:
                    r["check_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    print_sweep_case(case)
    return case


def print_sweep_case(case: dict) -> None:
    def cell(r):
        return f"{r['us']:8.1f} {r['frac_copy']:5.2f}" if r and "us" in r else f"{'err':>8} {'':5}"

    best = case.get("best")
    described = ""
    if best:
        c = best["config"]
        described = (
            f"bn={c['block_n']} split={best['split_k']} sb={c['sb_per_step']} warps={c['num_warps']} "
            f"err={best.get('max_rel_err_vs_reference', float('nan')):.1e}"
        )
    errors = sum("error" in r for r in case["results"])
    print(
        f"{case['format']:5} {case['out']:>6}x{case['in']:<6} {case['m']:>2} | {cell(case['split_default'])} | "
        f"{cell(case['rows_default'])} | {cell(best)} {described} | {len(case['results'])} configs"
        + (f", {errors} failed" if errors else ""),
        flush=True,
    )
    for r in case["results"]:
        if "error" in r and r["label"] != "candidate":
            print(f"    {r['label']} error: {r['error']}", flush=True)


SWEEP_HEADER = (
    f"{'fmt':5} {'out x in':>13} {'m':>2} | {'split us':>8} {'frac':>5} | {'rows us':>8} {'frac':>5} | "
    f"{'best us':>8} {'frac':>5} best rows config"
)


def run_rows_sweep(args, bandwidth: float, result: dict, out_dir: Path) -> None:
    """--rows-sweep: every (format, shape, m <= 4) case; stops starting cases after --budget-s seconds."""
    bench.BACKEND = args.backend  # run as a script, bench_quant_matmul is __main__: this is a second copy
    started = time.perf_counter()
    result["rows_sweep"] = []
    result["rows_sweep_calls_cap"] = args.sweep_max_calls
    print(SWEEP_HEADER)
    rng = np.random.default_rng(0)
    for fmt in args.formats:
        shapes = args.shapes or DECODE_SHAPES[fmt]
        for shape in shapes:
            if time.perf_counter() - started > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: skipping {fmt} {shape[0]}x{shape[1]}", flush=True)
                result.setdefault("rows_sweep_skipped", []).append([fmt, *shape])
                continue
            host = random_weight(rng, fmt, shape)
            weights = replicate(host, min(args.sweep_max_calls, copies_for(host.nbytes)))
            for m in [m for m in args.m if m <= 4]:
                x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(jnp.bfloat16)
                result["rows_sweep"].append(
                    rows_sweep_case(fmt, shape, m, x, weights, host.nbytes, args.runs, bandwidth)
                )
                (out_dir / "quant_matmul.json").write_text(json.dumps(result, indent=1))
            del weights
    print(f"rows sweep: {time.perf_counter() - started:.0f} s")
