"""Benchmark the FP8 decode GEMV (compiler/kernels/dense_gemv/kernel.py) on the GPU (run by hand on the device machine).

For each 8B decode shape (packed q/k/v 6144x4096, o 4096x4096, packed gate/up 28672x4096, down 4096x14336),
each scale layout (per-channel "chan", 128x128 "block") and m in {1, 8, 16} bf16 activation rows, times:
  kernel   fp8_gemv (the Triton kernel, the config pick_fp8_config chooses)
  xla      fp8_linear_xla: the jnp projection XLA fuses (fp8_linear's path before the kernel)
  bf16     an XLA bf16 matmul on a dense weight of the same shape (per shape and m, not per layout)
plus a large device-to-device copy (this run's bandwidth roofline). Reports microseconds per call, GB/s
(bytes of the weight read / time: values + scales for the fp8 variants) and the fraction of the copy
bandwidth. Prints a table; writes $OUT/fp8_gemv.json (after every shape, so partial results survive).

Timing (the method of tools/dev/bench_quant_matmul.py): one run is ONE executable holding `calls` back-to-back
projections, each on its own copy of the weight, with >= 128 MB of copies together (at least 8 calls) so
the calls read their weights from HBM, not the 50 MB L2, as a decode step does; a call's time is the median
run (of >= 20, after warm-up) of an executable cycling the copies to >= 384 calls, divided by its calls (a
run's fixed dispatch cost, which dominated 5-30 us calls at 8-16 calls per executable, is then small).

  JAX_PLATFORMS=cuda python -m ember.tools.dev.bench_fp8_gemv [--m 1 8 16] [--shapes 6144x4096 ...]
                                                          [--layouts chan block] [--runs 20] [--sweep]
--sweep also times SWEEP (~30 candidate configs) per shape and layout at m = 1 and prints the best (what
fp8_gemv.FP8_RULES should say); it adds ~30 compiles per shape and layout. --sweep words: SWEEP_WORDS only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

# Calls that share a weight (the copies are cycled with distinct activations) would be merged into one dot by
# XLA's dot merger, reading the weight once for several calls: off for this benchmark (set before jax starts).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_disable_hlo_passes=dot-merger").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ember.compiler.kernels.dense_gemv.fp8 import Fp8Weight, fp8_linear_xla, fp8_reference_matmul, quantize_fp8  # noqa: E402
from ember.compiler.kernels.dense_gemv.kernel import Fp8GemvConfig, fp8_gemv, launch_plan, pick_fp8_config  # noqa: E402
from ember.tools.dev.bench_quant_matmul import replicate, start_run  # noqa: E402
from ember.tools.hbm_probe import median_run_seconds  # noqa: E402

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
L2_FLUSH_BYTES = 128 << 20  # weights cycled per run: 2.5x the H200's 50 MB L2
MIN_CALLS, MAX_CALLS = 8, 64  # weight copies
MIN_TOTAL_CALLS = 384  # calls per executable (the copies cycled)
_C = Fp8GemvConfig
SWEEP = (
    [
        _C(block_n=bn, block_k=bk, split_k=s, step_reduce=True)
        for bn, bk in ((16, 512), (32, 256), (8, 1024))
        for s in (1, 2, 4)
    ]
    + [_C(block_n=16, block_k=512, split_k=2, step_reduce=True, num_warps=w) for w in (2, 8)]
    + [_C(block_n=16, block_k=512, split_k=2, step_reduce=True, prefetch=False)]
    + [_C(block_n=32, block_k=256, split_k=2), _C(block_n=16, block_k=256, split_k=2)]
    + [
        _C(block_n=bn, block_k=bk, split_k=s, use_dot=True, num_stages=st)
        for bn, bk, s, st in (
            (32, 256, 2, 3),
            (32, 256, 4, 3),
            (64, 256, 1, 3),
            (64, 128, 2, 4),
            (32, 512, 2, 2),
            (16, 256, 4, 3),
        )
    ]
    + [
        _C(block_n=bn, block_k=bk, split_k=s, num_warps=w, words=True)
        for bn, bk, s, w in ((8, 1024, 1, 4), (16, 512, 1, 4), (16, 1024, 1, 8), (8, 1024, 1, 2), (32, 256, 1, 4))
    ]
)
# the 4-byte word loop (the one-row picks: 1.05-1.17x the byte loop at 28672x4096 / 4096x14336): its tiles.
# Measured and dropped (docs/results/h200_fp8_gemv_words_69b267c.json): 2-3 tiles in flight in registers
# and cp.async stages in shared memory, neither ahead of one register tile.
SWEEP_WORDS = [
    _C(block_n=bn, block_k=bk, num_warps=w, words=True)
    for bn, bk, w in (
        (2, 1024, 4),
        (4, 1024, 4),
        (8, 1024, 4),
        (16, 1024, 8),
        (4, 512, 4),
        (8, 512, 4),
        (16, 512, 4),
        (8, 1024, 2),
        (4, 1024, 2),
    )
]


def copies_for(nbytes: int) -> int:
    return max(MIN_CALLS, min(MAX_CALLS, math.ceil(L2_FLUSH_BYTES / nbytes)))


def time_calls(fn, x, weights: list, runs: int) -> float:
    """Median seconds per call of fn(x, w) over an executable of >= MIN_TOTAL_CALLS calls: the copies cycled
    `reps` times, each cycle with its own copy of x (a run's fixed dispatch cost, ~0.1-1 ms, must be small beside 5-30 us calls)."""
    reps = -(-MIN_TOTAL_CALLS // len(weights))
    # a distinct activation array per cycle: identical (x, w) calls would be merged by XLA's CSE
    xs = [x] + [(x * (1.0 + r / 1024)).astype(x.dtype) for r in range(1, reps)]
    many = jax.jit(lambda xs, ws: [fn(xr, w) for xr in xs for w in ws])
    return median_run_seconds(lambda: jax.block_until_ready(many(xs, weights)), runs) / (reps * len(weights))


def bf16_fn(x, w):
    return jnp.einsum("mk,ok->mo", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def kernel_fn(config: Fp8GemvConfig | None):
    return lambda x, w: fp8_gemv(x, w, config)


def max_rel_err(x, w: Fp8Weight, config) -> float:
    got = np.asarray(jax.jit(kernel_fn(config))(x, w).astype(jnp.float32))
    want = fp8_reference_matmul(np.asarray(x.astype(jnp.float32)), w)
    return float(np.abs(got - want).max() / np.abs(want).max())


def timed(row: dict, name: str, fn, x, weights, nbytes: int, runs: int, bandwidth: float) -> None:
    try:
        seconds = time_calls(fn, x, weights, runs)
    except Exception as error:  # one failing variant must not lose the rest of the run
        row[f"{name}_error"] = f"{type(error).__name__}: {str(error)[:300]}"
        return
    row[f"{name}_us"] = round(seconds * 1e6, 2)
    row[f"{name}_gb_s"] = round(nbytes / seconds / 1e9, 1)
    row[f"{name}_frac_copy"] = round(nbytes / seconds / 1e9 / bandwidth, 3)


def sweep(shape, blocked, x, weights, nbytes, runs, configs) -> list[dict]:
    results = []
    for config in configs:
        entry = {"config": dataclasses.asdict(config)}
        try:
            launch_plan(x.shape[0], *shape, config, blocked=blocked)
            seconds = time_calls(kernel_fn(config), x, weights, runs)
            entry.update(us=round(seconds * 1e6, 2), gb_s=round(nbytes / seconds / 1e9, 1))
        except Exception as error:
            entry["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        results.append(entry)
    ok = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
    if ok:
        best = ok[0]
        best["max_rel_err_vs_reference"] = max_rel_err(x, weights[0], Fp8GemvConfig(**best["config"]))
        print(
            f"    sweep best of {len(ok)}: {best['us']} us {best['gb_s']} GB/s err "
            f"{best['max_rel_err_vs_reference']:.1e} {best['config']}",
            flush=True,
        )
    return ok[:6] + [r for r in results if "error" in r]


HEADER = (
    f"{'layout':6} {'out x in':>12} {'m':>2} | {'kernel us':>9} {'GB/s':>6} {'frac':>5} | {'xla us':>8} "
    f"{'GB/s':>6} {'frac':>5} | {'bf16 us':>8} {'GB/s':>6} | {'vs xla':>6} {'err':>8}  config"
)


def print_row(r: dict) -> None:
    get = lambda key, f="{:.1f}": f.format(r[key]) if key in r else "err"  # noqa: E731
    c = r["config"]
    print(
        f"{r['layout']:6} {r['out']:>5}x{r['in']:<6} {r['m']:>2} | {get('kernel_us'):>9} {get('kernel_gb_s', '{:.0f}'):>6} "
        f"{get('kernel_frac_copy', '{:.2f}'):>5} | {get('xla_us'):>8} {get('xla_gb_s', '{:.0f}'):>6} "
        f"{get('xla_frac_copy', '{:.2f}'):>5} | {get('bf16_us'):>8} {get('bf16_gb_s', '{:.0f}'):>6} | "
        f"{get('kernel_speedup_vs_xla', '{:.2f}x'):>6} {r.get('max_rel_err_vs_reference', float('nan')):>8.1e}  "
        f"bn={c['block_n']} bk={c['block_k']} split={r['split_k']} dot={int(c['use_dot'])}",
        flush=True,
    )
    for key in [k for k in r if k.endswith("error") and k != "max_rel_err_vs_reference"]:
        print(f"    {key}: {r[key]}", flush=True)


def bench_shape(shape, args, bandwidth: float, rng) -> list[dict]:
    out, inner = shape
    dense = None
    rows = []
    w_host = (rng.standard_normal(shape, np.float32) * rng.uniform(0.005, 0.05, (out, 1))).astype(np.float32)
    for layout in args.layouts:
        blocked = layout == "block"
        w = jax.device_get(quantize_fp8(w_host, blocked=blocked))
        nbytes = w.nbytes
        weights = replicate(w, copies_for(nbytes))
        for m in args.m:
            x = jax.random.normal(jax.random.key(m), (m, inner), jnp.float32).astype(jnp.bfloat16)
            config = pick_fp8_config(m, out, inner, blocked=blocked)
            row = {
                "layout": layout,
                "out": out,
                "in": inner,
                "m": m,
                "weight_bytes": nbytes,
                "calls": len(weights),
                "config": dataclasses.asdict(config),
                "split_k": launch_plan(m, out, inner, config, blocked=blocked)["split_k"],
            }
            try:
                row["max_rel_err_vs_reference"] = max_rel_err(x, weights[0], config)
            except Exception as error:
                row["check_error"] = f"{type(error).__name__}: {str(error)[:300]}"
            timed(row, "kernel", kernel_fn(config), x, weights, nbytes, args.runs, bandwidth)
            timed(row, "xla", fp8_linear_xla, x, weights, nbytes, args.runs, bandwidth)
            if not args.no_bf16:
                if dense is None:
                    dense_bytes = 2 * out * inner
                    dense = replicate(jnp.asarray(w_host, jnp.bfloat16), copies_for(dense_bytes))
                timed(row, "bf16", bf16_fn, x, dense, 2 * out * inner, args.runs, bandwidth)
            if row.get("kernel_us") and row.get("xla_us"):
                row["kernel_speedup_vs_xla"] = round(row["xla_us"] / row["kernel_us"], 2)
            print_row(row)
            if args.sweep and m == 1:
                row["sweep"] = sweep(
                    shape, blocked, x, weights, nbytes, args.runs, SWEEP_WORDS if args.sweep == "words" else SWEEP
                )
            rows.append(row)
        del weights
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=None, help="OUTxIN, e.g. 4096x14336 (default: the 8B shapes)")
    parser.add_argument("--layouts", nargs="+", default=["chan", "block"], choices=["chan", "block"])
    parser.add_argument("--m", nargs="+", type=int, default=[1, 8, 16], help="activation rows (<= 16)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--sweep",
        nargs="?",
        const="all",
        choices=["all", "words"],
        help="time SWEEP (or SWEEP_WORDS: the word loop's tiles) per shape and layout at m = 1",
    )
    parser.add_argument("--no-bf16", action="store_true", help="skip the dense bf16 reference")
    args = parser.parse_args(argv)
    args.runs = max(args.runs, 20)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    start = time.perf_counter()
    out_dir, bandwidth, result = start_run(args.runs, f"or {MAX_CALLS} calls")
    print(HEADER)
    rng = np.random.default_rng(0)
    for shape in shapes:
        result["cases"].extend(bench_shape(shape, args, bandwidth, rng))
        result["elapsed_s"] = round(time.perf_counter() - start, 1)
        (out_dir / "fp8_gemv.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out_dir / 'fp8_gemv.json'} ({result.get('elapsed_s', 0)} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
