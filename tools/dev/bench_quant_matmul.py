"""Benchmark the quantized GEMV kernels on the GPU (run by hand on the device machine).

For each format (Q4_K, Q6_K, Q8_0, Q5_0), each decode projection shape of Qwen2.5-1.5B and Llama-3-8B and
m in {1, 16} bf16 activation rows, times in one run:
  kernel    quant_matmul(backend="triton"): weights stay quantized in HBM
  xla_ref   XLA on the jnp reference: dequantize inside jit, then a bf16 matmul
  bf16      XLA bf16 matmul on a dense weight of the same shape
plus a large device-to-device copy (the bandwidth roofline of this run). Reports microseconds per
call, effective GB/s (bytes of the weight read / time; the quantized bytes for kernel and xla_ref)
and each as a fraction of the copy bandwidth. Prints a table; writes $OUT/quant_matmul.json.

Timing: one run is ONE executable holding `calls` back-to-back projections, each on its own copy of
the weight, with enough copies (>= 128 MB together, at most 256 calls) that the calls read their
weights from HBM, not from the 50 MB L2, as a decode step does (only the 0.2-0.4 MB k/v shapes stay
partly L2-resident). A call's time is the median run (of >= 20, after warm-up) divided by `calls`,
so the tens of microseconds of dispatch per executable are spread over >= 16 calls (`calls` in the
JSON).

  python tools/dev/bench_quant_matmul.py [--formats q4_k ...] [--shapes 1536x1536 ...] [--m 1 16]
                                     [--sweep] [--rows] [--runs 25]
  python tools/dev/bench_quant_matmul.py --rows-sweep --formats q4_k q6_k --m 1 4 [--budget-s 600]
--rows-sweep times only the rows variant's candidates (rows_candidates(): ~10-20 per case) beside the
split kernel's default and the rows default (config.py's tables) for every decode shape the engine
calls (DECODE_SHAPES), at most --sweep-max-calls weight copies per executable (64: only the 0.3 MB
Q6_K 256x1536 stays partly L2-resident), and prints the best per case with its error vs the reference.
--rows also times the "rows" variant (gguf_gemv/rows_*.py, m <= 4) beside the split kernel, and at
m = 1 a small sweep of its configurations (ROWS_SWEEP), printing the best with its error.
--sweep also times a set of candidate kernel configurations per case and reports the best (the
numbers compiler/kernels/gguf_gemv/config.py's table should hold).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ember.compiler.kernels.gguf_gemv import FORMATS, QuantizedWeight, pick_config, quant_matmul
from ember.compiler.kernels.gguf_gemv.config import QuantMatmulConfig
from ember.compiler.kernels.gguf_gemv.matmul import launch_plan
from ember.compiler.kernels.gguf_gemv.reference import dequantize, quant_matmul_ref
from ember.tools.hbm_probe import copy_bandwidth, median_run_seconds

SHAPES = {
    "qwen2.5-1.5b": [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960), (151936, 1536)],
    "llama-3-8b": [(4096, 4096), (14336, 4096), (4096, 14336)],
}
# The matrices a decode step multiplies, per format, as the h200 plans call them (runtime/loading/weights.py packs
# consecutive parts of one format: q+k, gate+up; a llama.cpp Q4_K_M file makes attn_v and ffn_down Q6_K in
# about half the layers (runtime/loading/synthetic_gguf.py) and the output head Q6_K; the head of a tied model is
# its Q6_K embedding table).
DECODE_SHAPES = {
    "q4_k": [
        (1792, 1536),
        (2048, 1536),
        (1536, 1536),
        (17920, 1536),
        (1536, 8960),  # 1.5B: q+k, q+k+v, o, gate+up, down
        (5120, 4096),
        (6144, 4096),
        (4096, 4096),
        (28672, 4096),
        (4096, 14336),
    ],  # 8B
    "q6_k": [
        (256, 1536),
        (1536, 8960),
        (151936, 1536),  # 1.5B: v, down, head
        (1024, 4096),
        (4096, 14336),
        (128256, 4096),
    ],  # 8B
    "q8_0": [(1536, 1536), (151936, 1536)],
    "q5_0": [(1536, 640), (4096, 640)],  # gemma-3-270m Q4_K_M: q+k+v, gate+up (rows of 640: no 256-blocks)
}
L2_FLUSH_BYTES = 128 << 20  # weights cycled per run: 2.5x the H200's 50 MB L2
MIN_CALLS, MAX_CALLS = 16, 256  # (the cap leaves the ~0.2-0.4 MB k/v projections partly L2-resident)
SWEEP = (
    [QuantMatmulConfig(block_n=b, split_k=s, num_warps=w) for b in (32, 64, 128) for s in (1, 2, 4) for w in (4, 8)]
    + [QuantMatmulConfig(block_n=16, split_k=s) for s in (4, 8)]
    + [QuantMatmulConfig(block_n=64, num_stages=st) for st in (2, 4)]
    + [QuantMatmulConfig(block_n=b, split_k=s, use_dot=True) for b, s in ((32, 2), (64, 1))]
)


# the "rows" variant (gguf_gemv/rows_kernel.py, m <= 4): a default timed beside the split kernel, and a small sweep at m = 1
def rows_config(m: int) -> QuantMatmulConfig:
    return QuantMatmulConfig(variant="rows", block_n=64 if m == 1 else 32, sb_per_step=2)


ROWS_SWEEP = [
    QuantMatmulConfig(variant="rows", block_n=b, sb_per_step=sb, num_warps=w)
    for b, sb, w in ((16, 8, 4), (32, 2, 4), (32, 8, 4), (64, 4, 8), (128, 2, 8))
]
ROWS_FORMATS = ("q4_k", "q6_k", "q8_0", "q5_0")
BACKEND = "triton"  # --backend reference: a CPU smoke test of this script's plumbing


def plane_shapes(fmt: str, shape: tuple[int, int]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    out, inner = shape
    sb, blk = inner // 256, inner // 32
    return {
        "q4_k": {
            "qs": ((sb, out, 32), np.uint32),
            "scales": ((sb, out, 3), np.uint32),
            "d": ((sb, out), np.float16),
            "dmin": ((sb, out), np.float16),
        },
        "q6_k": {
            "ql": ((sb, out, 32), np.uint32),
            "qh": ((sb, out, 16), np.uint32),
            "scales": ((sb, out, 16), np.int8),
            "d": ((sb, out), np.float16),
        },
        "q8_0": {"qs": ((blk, out, 32), np.int8), "d": ((blk, out), np.float16)},
        "q5_0": {"qs": ((blk, out, 16), np.uint8), "qh": ((blk, out), np.uint32), "d": ((blk, out), np.float16)},
    }[fmt]


def random_weight(rng: np.random.Generator, fmt: str, shape: tuple[int, int]) -> QuantizedWeight:
    """Random planes in the device layout (any code bits are valid; fp16 scales small and positive)."""
    planes = {}
    for name, (dims, dtype) in plane_shapes(fmt, shape).items():
        if dtype == np.float16:
            planes[name] = np.abs(rng.normal(0.0, 0.01, dims)).astype(np.float16)
        else:
            n = int(np.prod(dims)) * np.dtype(dtype).itemsize
            planes[name] = np.frombuffer(rng.bytes(n), dtype).reshape(dims)
    return QuantizedWeight(planes, fmt, shape)


def copies_for(nbytes: int) -> int:
    return max(MIN_CALLS, min(MAX_CALLS, math.ceil(L2_FLUSH_BYTES / nbytes)))


def replicate(tree, count: int) -> list:
    """`count` distinct device buffers holding the same values."""
    first = jax.device_put(tree)
    return [first] + [jax.tree.map(lambda a: a.copy(), first) for _ in range(count - 1)]


def time_calls(fn, x, weights: list, runs: int) -> float:
    """Median seconds per call of fn(x, w), `len(weights)` calls in one executable."""
    many = jax.jit(lambda x, ws: [fn(x, w) for w in ws])
    return median_run_seconds(lambda: jax.block_until_ready(many(x, weights)), runs) / len(weights)


def kernel_fn(config: QuantMatmulConfig | None):
    return lambda x, w: quant_matmul(x, w, backend=BACKEND, config=config)


def xla_ref_fn(x, w):
    return jnp.einsum("mk,ok->mo", x, dequantize(w).astype(x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)


def bf16_fn(x, w):
    return jnp.einsum("mk,ok->mo", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def max_rel_err(x, w: QuantizedWeight, config) -> float:
    got = jax.jit(kernel_fn(config))(x, w).astype(jnp.float32)
    ref = jax.jit(quant_matmul_ref)(x.astype(jnp.float32), w)
    return float(jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref)))


def bench_case(fmt: str, shape: tuple[int, int], ms: list[int], args, bandwidth: float, rng) -> list[dict]:
    host = random_weight(rng, fmt, shape)
    nbytes = host.nbytes
    weights = replicate(host, copies_for(nbytes))
    dense_bytes = 2 * shape[0] * shape[1]
    dense = replicate(jnp.asarray(rng.standard_normal(shape, np.float32) * 0.02, jnp.bfloat16), copies_for(dense_bytes))
    rows = []
    for m in ms:
        x = jax.random.normal(jax.random.key(m), (m, shape[1]), jnp.float32).astype(jnp.bfloat16)
        config = pick_config(fmt, m, *shape)
        row = {
            "format": fmt,
            "out": shape[0],
            "in": shape[1],
            "m": m,
            "weight_bytes": nbytes,
            "bf16_bytes": dense_bytes,
            "calls": len(weights),
            "config": dataclasses.asdict(config),
            "split_k": launch_plan(fmt, m, *shape, config)["split_k"],
        }
        try:
            row["max_rel_err_vs_reference"] = max_rel_err(x, weights[0], config)
        except Exception as error:
            row["max_rel_err_vs_reference"] = float("nan")
            row["check_error"] = f"{type(error).__name__}: {str(error)[:300]}"
        timings = {
            "kernel": (kernel_fn(config), weights, nbytes),
            "xla_ref": (xla_ref_fn, weights, nbytes),
            "bf16": (bf16_fn, dense, dense_bytes),
        }
        for name, (fn, ws, nb) in timings.items():
            try:
                seconds = time_calls(fn, x, ws, args.runs)
            except Exception as error:  # one failing variant must not lose the rest of the run
                row[f"{name}_error"] = f"{type(error).__name__}: {str(error)[:300]}"
                continue
            row[f"{name}_us"] = round(seconds * 1e6, 2)
            row[f"{name}_gb_s"] = round(nb / seconds / 1e9, 1)
            row[f"{name}_frac_copy"] = round(nb / seconds / 1e9 / bandwidth, 3)
        if "kernel_us" in row and "xla_ref_us" in row:
            row["kernel_speedup_vs_xla_ref"] = round(row["xla_ref_us"] / row["kernel_us"], 2)
        if "kernel_us" in row and "bf16_us" in row:
            row["kernel_speedup_vs_bf16"] = round(row["bf16_us"] / row["kernel_us"], 2)
        if args.sweep:
            row["sweep"] = sweep(fmt, shape, m, x, weights, nbytes, args.runs)
        print_row(row)
        if args.rows and fmt in ROWS_FORMATS and m <= 4:
            rows_case(row, fmt, shape, m, x, weights, nbytes, args.runs, bandwidth)
        rows.append(row)
    return rows


def rows_case(row, fmt, shape, m, x, weights, nbytes, runs, bandwidth) -> None:
    """Time the rows variant (its default config; at m = 1 also ROWS_SWEEP) into row["rows"]."""
    config = rows_config(m)
    info = {"config": dataclasses.asdict(config)}
    try:
        info["max_rel_err_vs_reference"] = max_rel_err(x, weights[0], config)
        seconds = time_calls(kernel_fn(config), x, weights, runs)
        info.update(
            us=round(seconds * 1e6, 2),
            gb_s=round(nbytes / seconds / 1e9, 1),
            frac_copy=round(nbytes / seconds / 1e9 / bandwidth, 3),
        )
        if "kernel_us" in row:
            info["speedup_vs_kernel"] = round(row["kernel_us"] / info["us"], 2)
        if "bf16_us" in row:
            info["speedup_vs_bf16"] = round(row["bf16_us"] / info["us"], 2)
        print(
            f"    rows {info['us']:.1f} us {info['gb_s']:.0f} GB/s frac {info['frac_copy']:.2f} "
            f"err {info['max_rel_err_vs_reference']:.1e} x{info.get('speedup_vs_kernel', 0):.2f} vs kernel "
            f"x{info.get('speedup_vs_bf16', 0):.2f} vs bf16  block_n={config.block_n} sb_per_step={config.sb_per_step}",
            flush=True,
        )
    except Exception as error:
        info["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        print(f"    rows error: {info['error']}", flush=True)
    if m == 1:
        info["sweep"] = sweep(fmt, shape, m, x, weights, nbytes, runs, ROWS_SWEEP, label="rows")
    row["rows"] = info


def sweep(fmt, shape, m, x, weights, nbytes, runs, configs=None, label="") -> list[dict]:
    results = []
    for config in configs or SWEEP:
        try:
            seconds = time_calls(kernel_fn(config), x, weights, runs)
        except Exception as error:
            results.append({"config": dataclasses.asdict(config), "error": str(error)[:200]})
            continue
        results.append(
            {
                "config": dataclasses.asdict(config),
                "us": round(seconds * 1e6, 2),
                "gb_s": round(nbytes / seconds / 1e9, 1),
            }
        )
    timed = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
    if timed:
        best = timed[0]
        if label:
            try:
                best["max_rel_err_vs_reference"] = max_rel_err(x, weights[0], QuantMatmulConfig(**best["config"]))
            except Exception as error:
                best["check_error"] = str(error)[:200]
        print(f"    {label} best of {len(timed)}: {best['us']} us {best['gb_s']} GB/s {best['config']}", flush=True)
    return timed[:5] + [r for r in results if "error" in r]


HEADER = (
    f"{'fmt':5} {'out x in':>13} {'m':>2} | {'kernel us':>9} {'GB/s':>7} {'frac':>5} | "
    f"{'xla_ref us':>10} {'GB/s':>7} | {'bf16 us':>8} {'GB/s':>7} | {'vs ref':>6} {'vs bf16':>7} {'err':>8}"
)


def print_row(r: dict) -> None:
    def get(key, fmt="{:.1f}"):
        return fmt.format(r[key]) if key in r else "err"

    print(
        f"{r['format']:5} {r['out']:>6}x{r['in']:<6} {r['m']:>2} | {get('kernel_us'):>9} {get('kernel_gb_s'):>7} "
        f"{get('kernel_frac_copy', '{:.2f}'):>5} | {get('xla_ref_us'):>10} {get('xla_ref_gb_s'):>7} | "
        f"{get('bf16_us'):>8} {get('bf16_gb_s'):>7} | {get('kernel_speedup_vs_xla_ref', '{:.1f}x'):>6} "
        f"{get('kernel_speedup_vs_bf16', '{:.2f}x'):>7} {r['max_rel_err_vs_reference']:>8.1e}",
        flush=True,
    )
    for key in ("check_error", "kernel_error", "xla_ref_error", "bf16_error"):
        if key in r:
            print(f"    {key}: {r[key]}", flush=True)


def start_run(runs: int, copies_note: str) -> tuple[Path, float, dict]:
    """What every GEMV benchmark run starts with: the $OUT folder, the copy bandwidth of this run, and the
    result's header (devices, versions, timing method; `cases` to fill). Prints the bandwidth."""
    out_dir = Path(os.environ.get("OUT", "./out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth(runs=runs)
    result = {
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "copy_bandwidth_gb_s": round(bandwidth, 1),
        "activations": "bfloat16",
        "timing": f"median of {runs} runs; one run = one executable of `calls` projections, each on its "
        f"own copy of the weight (>= {L2_FLUSH_BYTES >> 20} MB together, {copies_note})",
        "cases": [],
    }
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    print(f"devices {result['devices']}  copy bandwidth {bandwidth:.0f} GB/s (frac = kernel GB/s / copy GB/s)")
    return out_dir, bandwidth, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--shapes", nargs="+", default=None, help="OUTxIN, e.g. 1536x8960 (default: all)")
    parser.add_argument("--m", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument(
        "--rows", action="store_true", help="also time the rows variant (q4_k, m <= 4) and, at m = 1, sweep ROWS_SWEEP"
    )
    parser.add_argument(
        "--rows-sweep",
        action="store_true",
        help="only sweep the rows variant (m <= 4 of --m; shapes: --shapes or DECODE_SHAPES per "
        "format) beside the split and rows defaults; prints the best per case",
    )
    parser.add_argument(
        "--sweep-max-calls",
        type=int,
        default=64,
        help="--rows-sweep: at most this many weight copies per executable (compile time)",
    )
    parser.add_argument(
        "--budget-s", type=float, default=600.0, help="--rows-sweep: start no new shape after this many seconds"
    )
    parser.add_argument("--backend", default="triton", choices=["triton", "reference"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global BACKEND
    BACKEND = args.backend
    args.runs = max(args.runs, 20)
    if args.shapes:
        args.shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    shapes = args.shapes or [s for family in SHAPES.values() for s in family]
    out_dir, bandwidth, result = start_run(args.runs, "so HBM reads, not L2")
    result["backend"] = BACKEND
    if args.rows_sweep:
        from ember.tools.dev.bench_quant_rows import run_rows_sweep  # (it imports this module's helpers)

        run_rows_sweep(args, bandwidth, result, out_dir)
        (out_dir / "quant_matmul.json").write_text(json.dumps(result, indent=1))
        print(f"wrote {out_dir / 'quant_matmul.json'}")
        return 0
    print(HEADER)
    rng = np.random.default_rng(0)
    for fmt in args.formats:
        for shape in shapes:
            result["cases"].extend(bench_case(fmt, shape, args.m, args, bandwidth, rng))
            (out_dir / "quant_matmul.json").write_text(json.dumps(result, indent=1))  # partial results survive
    print(f"wrote {out_dir / 'quant_matmul.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
