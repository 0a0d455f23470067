"""Time the rows GEMV kernels as a decode step runs them: inside a CUDA graph (run by hand on the GPU).

Why this exists: tools/dev/bench_quant_rows.py times one XLA executable of back-to-back calls, and outside a
command buffer each Triton custom call costs ~10-15 us of dispatch (h200_launch_overhead*.json), more than
most of these kernels run; an engine step is one CUDA graph launch, where only the kernel's own duration
counts. Here each candidate is launched straight from Triton on torch tensors, `calls` launches (each on
its own copy of the weight, >= 128 MB together, so reads come from HBM, not L2) are captured in one torch
CUDA graph, and a call's time = median graph replay / calls (CUDA events). Split-K candidates are timed
with the fp32 partial sum after them (`sum` column: what XLA adds after the kernel in a plan); the best
five again with fp32 activations (`x_f32`: what the kernel gains when the plan converts before it).

  python tools/dev/tune_gemv_graphs.py [--formats q4_k q6_k] [--shapes 17920x1536 ...] [--budget-s 420]
  python tools/dev/tune_gemv_graphs.py --variant dp4a --m 1 8   the integer-dot kernels (int8 activations,
                                                            quantized before the graph: the kernel alone), with
                                                            the float rows kernel's pick at m = 1 as the baseline

Candidates: row tiles 4..128, split-K 1..8, 1..4 super-blocks per step, 1..8 warps where a thread holds
4..16 code words per step (rows_candidates's register sizing, wider). Kernels are compiled first in a pool
of processes (Triton's disk cache), then timed one by one. Prints the best per shape against the config
pick_config gives today; writes $OUT/gemv_graphs.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jax only for the launch plans: the GPU stays torch's

import numpy as np  # noqa: E402

from ember.compiler.kernels.gguf_gemv.config import QuantMatmulConfig, pick_config  # noqa: E402
from ember.compiler.kernels.gguf_gemv.matmul import launch_plan  # noqa: E402
from ember.tools.dev.bench_quant_matmul import DECODE_SHAPES, L2_FLUSH_BYTES, plane_shapes, random_weight  # noqa: E402

WORDS_PER_UNIT = {"q4_k": 32, "q6_k": 64}  # u32 code words per (super-block, row), for register sizing


def candidates(fmt: str, out: int, inner: int, variant: str = "rows", m: int = 1) -> list[QuantMatmulConfig]:
    units = inner // 256
    # words per thread: the dp4a kernel keeps one accumulator per sub-block, so it affords larger tiles
    low, high = (4, 16) if variant == "rows" else (4, 32)
    found, seen = [], set()
    for bn in (4, 8, 16, 32, 64, 128) if variant == "rows" else (4, 8, 16, 32, 64):
        for split in (1, 2, 3, 4, 8) if variant == "rows" else (1, 2, 4, 8):
            if split > units or -(-out // bn) * split > 132 * 128:
                continue
            for sb in (1, 2, 4):
                for warps in (1, 2, 4, 8):
                    per_thread = sb * bn * WORDS_PER_UNIT[fmt] / (32 * warps)
                    if not low <= per_thread <= high:
                        continue
                    config = QuantMatmulConfig(
                        variant=variant, block_n=bn, split_k=split, sb_per_step=sb, num_warps=warps, num_stages=1
                    )
                    plan = launch_plan(fmt, m, out, inner, config)
                    key = (plan["grid"], tuple(sorted(plan["meta"].items())), warps)
                    if key not in seen:
                        seen.add(key)
                        found.append(config)
    return found


def kernel_planes(fmt: str, planes: dict) -> list:
    """The planes in the rows kernel's argument order."""
    from ember.compiler.kernels.gguf_gemv.rows_kernel import ROWS_KERNELS

    return [planes[name] for name in ROWS_KERNELS[fmt][1]]


def to_torch(array: np.ndarray):
    """A host plane on the GPU (uint32 through an int32 view: torch.from_numpy takes no uint32 before 2.3)."""
    import torch

    if array.dtype == np.uint32:
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int32)).cuda().view(torch.uint32)
    return torch.from_numpy(np.ascontiguousarray(array)).cuda()


def launch(fmt, x, planes, out, config, plan):
    """x: the activations, or for the dp4a variant the pair (qa, da) that gguf_gemv/act_quant.py makes of them."""
    if config.variant == "dp4a":
        from ember.compiler.kernels.gguf_gemv.dp4a_kernel import dp4a_gemv_kernel

        dp4a_gemv_kernel[plan["grid"]](
            *x, *planes, out, num_warps=config.num_warps, num_stages=config.num_stages, **plan["meta"]
        )
        return
    from ember.compiler.kernels.gguf_gemv.rows_kernel import ROWS_KERNELS

    ROWS_KERNELS[fmt][0][plan["grid"]](
        x, *planes, out, num_warps=config.num_warps, num_stages=config.num_stages, **plan["meta"]
    )


def activations(x, config: QuantMatmulConfig, plan: dict):
    """What `launch` takes for x (torch [m, in]): x itself, or (qa, da) padded to the plan's M_PAD rows."""
    if config.variant != "dp4a":
        return x
    import jax.numpy as jnp

    from ember.compiler.kernels.gguf_gemv.act_quant import quantize_activations
    from ember.compiler.kernels.gguf_gemv.dp4a import pad_rows

    order = "q6_k" if plan["meta"]["Q6"] else "q4_k"
    qa, da = pad_rows(*quantize_activations(jnp.asarray(x.float().cpu().numpy()), order), plan["meta"]["M_PAD"])
    return to_torch(np.asarray(qa)), to_torch(np.asarray(da))


def rows_out(plan: dict, m: int) -> int:
    return plan["meta"].get("M_PAD", m)


def compile_one(job) -> str | None:
    """Worker: compile one (fmt, shape, config) into Triton's disk cache by launching it on tiny buffers
    (a launch of N, K as constexprs specialises exactly as the timed launch; only pointers differ)."""
    fmt, (out_n, inner), config_dict, m = job
    try:
        import torch

        config = QuantMatmulConfig(**config_dict)
        plan = launch_plan(fmt, m, out_n, inner, config)
        shapes = plane_shapes(fmt, (out_n, inner))  # values don't matter to the compiler
        planes = kernel_planes(fmt, {name: to_torch(np.zeros(dims, dtype)) for name, (dims, dtype) in shapes.items()})
        x = activations(torch.zeros((m, inner), dtype=torch.bfloat16, device="cuda"), config, plan)
        y = torch.empty(
            (plan["split_k"], rows_out(plan, m), out_n),
            device="cuda",
            dtype=torch.bfloat16 if plan["split_k"] == 1 else torch.float32,
        )
        launch(fmt, x, planes, y, config, plan)
        torch.cuda.synchronize()
        return None
    except Exception as error:  # reported, and the timing pass skips it
        return f"{type(error).__name__}: {str(error)[:200]}"


def time_graph(body, replays: int = 20) -> float:
    """Median seconds of one replay of a CUDA graph holding body()'s launches."""
    import torch

    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def time_config(fmt, x, copies, config) -> tuple[float, float, object]:
    """(seconds per call of the kernel alone, with the split-K partial sum after it, first output [m, out])."""
    import torch

    out_n = copies[0][0].shape[1]
    m = x.shape[0]
    plan = launch_plan(fmt, m, out_n, x.shape[1], config)
    dtype = torch.bfloat16 if plan["split_k"] == 1 else torch.float32
    outs = [torch.empty((plan["split_k"], rows_out(plan, m), out_n), device="cuda", dtype=dtype) for _ in copies]
    inputs = activations(x, config, plan)

    def kernels():
        for planes, y in zip(copies, outs):
            launch(fmt, inputs, planes, y, config, plan)

    def with_sum():
        for planes, y in zip(copies, outs):
            launch(fmt, inputs, planes, y, config, plan)
            if plan["split_k"] > 1:
                y.sum(0)

    alone = time_graph(kernels) / len(copies)
    summed = time_graph(with_sum) / len(copies) if plan["split_k"] > 1 else alone
    return alone, summed, outs[0].float().sum(0)[:m]


def dense_seconds(x, out: int, inner: int) -> float:
    """cuBLAS bf16 GEMV of the same shape (x @ W.T), graph-timed the same way: the dense baseline."""
    import torch

    copies = [
        torch.randn((out, inner), device="cuda", dtype=torch.bfloat16)
        for _ in range(max(4, min(256, -(-L2_FLUSH_BYTES // (2 * out * inner)))))
    ]
    return time_graph(lambda: [x @ w.T for w in copies]) / len(copies)


def copy_bandwidth() -> float:
    import torch

    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / time_graph(lambda: b.copy_(a)) / 1e9


def tune_shape(fmt, shape, rng, compile_errors, bandwidth, variant: str = "rows", m: int = 1) -> dict:
    import torch

    out, inner = shape
    base = kernel_planes(fmt, {name: to_torch(a) for name, a in random_weight(rng, fmt, shape).planes.items()})
    nbytes = sum(p.numel() * p.element_size() for p in base)
    copies = [base] + [[p.clone() for p in base] for _ in range(max(4, min(256, -(-L2_FLUSH_BYTES // nbytes))) - 1)]
    x = torch.randn((m, inner), device="cuda", dtype=torch.bfloat16)
    today = pick_config(fmt, m, out, inner)
    configs = [today] + [c for c in candidates(fmt, out, inner, variant, m) if c != today]
    float_rows = dataclasses.replace(today, variant="rows") if today.variant == "dp4a" and m <= 4 else None
    if float_rows is not None:  # the float kernel's config at these rows, timed beside (its error: dp4a's)
        configs.insert(1, float_rows)
    results, reference = [], None
    for config in configs:
        key = (fmt, shape, tuple(sorted(dataclasses.asdict(config).items())), m)
        row = {"config": dataclasses.asdict(config), "today": config == today, "float_rows": config == float_rows}
        if key in compile_errors:
            row["error"] = compile_errors[key]
            results.append(row)
            continue
        try:
            alone, summed, y = time_config(fmt, x, copies, config)
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
            results.append(row)
            continue
        if reference is None:
            reference = y
        err = float((y - reference).abs().max() / reference.abs().max())
        row.update(
            us=round(alone * 1e6, 2),
            us_with_sum=round(summed * 1e6, 2),
            gb_s=round(nbytes / summed / 1e9, 1),
            max_rel_diff_vs_today=err,
        )
        results.append(row)
    timed = sorted(
        (r for r in results if "us" in r and r["max_rel_diff_vs_today"] < 1e-2 and not r["float_rows"]),
        key=lambda r: r["us_with_sum"],
    )
    x32 = x.float()  # the activations in fp32: no conversion inside the kernel (a plan would convert before)
    for r in timed[:5] if variant == "rows" else []:  # dp4a reads int8 activations: no f32 variant
        try:
            _, summed, y = time_config(fmt, x32, copies, QuantMatmulConfig(**r["config"]))
            r["us_with_sum_x_f32"] = round(summed * 1e6, 2)
            r["max_rel_diff_x_f32"] = float((y - reference).abs().max() / reference.abs().max())
        except Exception as error:
            r["x_f32_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    dense = dense_seconds(x, out, inner)
    case = {
        "format": fmt,
        "out": out,
        "in": inner,
        "m": m,
        "variant": variant,
        "weight_bytes": nbytes,
        "calls": len(copies),
        "today": next((r for r in results if r["today"]), None),
        "float_rows": next((r for r in results if r["float_rows"]), None),
        "best": timed[:5],
        "dense_bf16_us": round(dense * 1e6, 2),
        "dense_bf16_gb_s": round(2 * out * inner / dense / 1e9, 1),
        "candidates": len(results),
        "failed": [r for r in results if "error" in r][:5],
    }
    t, b = case["today"], (timed[0] if timed else None)
    describe = lambda r: (
        f"{r['us_with_sum']:7.2f} us {r['gb_s']:6.0f} GB/s ({r['gb_s'] / bandwidth:.2f})"
        if r and "us" in r
        else "    error"
    )
    f = case["float_rows"]
    print(
        f"{variant} m={m} {fmt} {out:>6}x{inner:<6} today {describe(t)} | best {describe(b)} "
        f"{'| float rows ' + describe(f) + ' ' if f else ''}"
        f"{b and {k: b['config'][k] for k in ('block_n', 'split_k', 'sb_per_step', 'num_warps')}} | "
        f"x f32 {b and b.get('us_with_sum_x_f32')} us | dense bf16 {case['dense_bf16_us']:.2f} us {case['dense_bf16_gb_s']:.0f} GB/s | {len(results)} configs",
        flush=True,
    )
    del copies
    torch.cuda.empty_cache()
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", nargs="+", default=["q4_k", "q6_k"], choices=["q4_k", "q6_k"])
    parser.add_argument("--shapes", nargs="+", default=None, help="OUTxIN (default: every decode shape)")
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 4) - 2))
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--variant", default="rows", choices=["rows", "dp4a"])
    parser.add_argument("--m", type=int, nargs="+", default=[1], help="activation rows (rows variant: <= 4)")
    args = parser.parse_args(argv)
    import torch

    started = time.perf_counter()
    wanted = [tuple(map(int, s.split("x"))) for s in args.shapes or ()]
    formats = args.formats
    cases = [
        (fmt, shape, m)
        for m in args.m
        for fmt in formats
        for shape in DECODE_SHAPES[fmt]
        if not wanted or shape in wanted
    ]
    jobs = [
        (fmt, shape, dataclasses.asdict(c), m)
        for fmt, shape, m in cases
        for c in [pick_config(fmt, m, *shape)] + candidates(fmt, *shape, args.variant, m)
    ]
    import multiprocessing

    compile_errors = {}
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(compile_one, job) for job in jobs]
        for (fmt, shape, config, m), future in zip(jobs, futures):
            if time.perf_counter() - started > args.budget_s / 2:  # the rest compile when first timed
                pool.shutdown(cancel_futures=True)
                break
            error = future.result()
            if error:
                compile_errors[(fmt, shape, tuple(sorted(config.items())), m)] = error
    print(
        f"compiled {len(jobs)} kernels in {time.perf_counter() - started:.0f} s ({len(compile_errors)} failed)",
        flush=True,
    )
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}  copy bandwidth {bandwidth:.0f} GB/s", flush=True)
    result = {
        "what": __doc__.split("\n")[0],
        "commit": args.commit,
        "device": torch.cuda.get_device_name(),
        "copy_bandwidth_gb_s": round(bandwidth, 1),
        "timing": "CUDA graph replay, median of 20",
        "cases": [],
        "skipped": [],
    }
    out_dir = Path(os.environ.get("OUT", "./out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for fmt, shape, m in cases:
        if time.perf_counter() - started > args.budget_s:
            result["skipped"].append([fmt, *shape, m])
            continue
        result["cases"].append(tune_shape(fmt, shape, rng, compile_errors, bandwidth, args.variant, m))
        (out_dir / "gemv_graphs.json").write_text(json.dumps(result, indent=1))
    print(f"done in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
