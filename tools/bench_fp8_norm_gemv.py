"""Benchmark the norm-prologue FP8 GEMV (compiler/ops/quant/fp8_norm_gemv.py) against what it replaces, as a
decode step runs them: inside a CUDA graph (run by hand on the device machine).

At the 8B decode shapes (packed q/k/v 6144x4096 as three parts, packed gate/up 28672x4096), one bf16 row:
  unfused      add_rms_norm_kernel (norm_gpu.py) then the FP8 GEMV the plan runs today (fp8_gemv_parts_kernel /
               fp8_gemv_kernel with GATE_UP, pick_fp8_config's config)
  gemv_alone   that GEMV alone
  fused        fp8_norm_gemv_kernel per config (SWEEP, or the default one)
  walk_alone   the fused kernel without its prologue (NORM=False: x taken as the normed row): the persistent walk

Timing is tools/tune_gemv_graphs.py's: Triton kernels launched from torch, `calls` launches (each on its own
copy of the weight, >= 128 MB together, so reads come from HBM) captured in one CUDA graph, a call's time the
median replay / calls. Each fused config is first checked against the unfused pair (the sum bit-equal, the
outputs' largest difference in bf16 ulps). Writes $OUT/fp8_norm_gemv.json.

  python -m ember.tools.bench_fp8_norm_gemv [--sweep]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jax only for quantizing and launch plans: the GPU is torch's

import numpy as np  # noqa: E402

from ember.compiler.ops.quant.fp8 import quantize_fp8  # noqa: E402
from ember.compiler.ops.quant.fp8_gemv_config import launch_plan as gemv_plan, pick_fp8_config  # noqa: E402
from ember.compiler.ops.quant.fp8_norm_gemv import Fp8NormGemvConfig, launch_plan  # noqa: E402
from ember.tools.bench_quant_matmul import L2_FLUSH_BYTES  # noqa: E402
from ember.tools.tune_gemv_graphs import copy_bandwidth, time_graph, to_torch  # noqa: E402

CASES = [("parts", 6144, 4096, (4096, 1024, 1024)), ("gate_up", 28672, 4096, ())]
SWEEP = [Fp8NormGemvConfig(block_n=bn, num_warps=w, programs_per_sm=p)
         for bn in (2, 4, 8) for w in (4, 8) for p in (2, 4, 8)]
EPS = 1e-5


class Case:
    """One shape's weight copies and activations on the GPU (torch), and launchers of each variant."""

    def __init__(self, form, out, inner, sizes, rng):
        import torch
        self.form, self.out, self.inner, self.sizes = form, out, inner, sizes
        w = quantize_fp8((rng.standard_normal((out, inner)) * 0.05).astype(np.float32))
        values = to_torch(np.asarray(w.values).view(np.uint8)).view(torch.float8_e4m3fn)
        scale = to_torch(np.asarray(w.scale, np.float32))
        copies = max(8, -(-L2_FLUSH_BYTES // (out * inner)))
        self.weights = [(values.clone(), scale.clone()) for _ in range(copies)]
        bf16 = lambda a: torch.from_numpy(a.astype(np.float32)).cuda().to(torch.bfloat16)  # noqa: E731
        self.x = bf16(rng.standard_normal((1, inner)) * 3)
        self.y = bf16(rng.standard_normal((1, inner)))
        self.g = bf16(rng.uniform(0.5, 1.5, inner))
        widths = sizes if form == "parts" else (out // 2,)
        self.outs = [[torch.empty((1, n), device="cuda", dtype=torch.bfloat16) for n in widths]
                     + [torch.empty((1, 1), device="cuda", dtype=torch.bfloat16)] * (3 - len(widths))
                     for _ in self.weights]
        self.sum = torch.empty_like(self.x)
        self.h = torch.empty_like(self.x)

    def norm(self):
        from ember.compiler.ops.norm_gpu import add_rms_norm_kernel, launch_plan as norm_plan
        plan = norm_plan(1, self.inner)
        add_rms_norm_kernel[plan["grid"]](self.x, self.y, self.g, self.sum, self.h, EPS=EPS,
                                          num_warps=plan["num_warps"], **plan["meta"])

    def gemv(self, copy: int):
        from ember.compiler.ops.quant.fp8_gemv import fp8_gemv_kernel, fp8_gemv_parts_kernel
        config = pick_fp8_config(1, self.out, self.inner)
        plan = gemv_plan(1, self.out, self.inner, config, blocked=False, gate_up=self.form == "gate_up")
        (values, scale), outs = self.weights[copy], self.outs[copy]
        launch = dict(num_warps=config.num_warps, num_stages=config.num_stages, IEEE=False, W_BITCAST=False,
                      **plan["meta"])
        if self.form == "parts":
            fp8_gemv_parts_kernel[plan["grid"]](self.h, values, scale, *outs, N1=self.sizes[0],
                                                N2=self.sizes[0] + self.sizes[1], **launch)
        else:
            fp8_gemv_kernel[plan["grid"]](self.h, values, scale, outs[0], **launch)

    def fused(self, copy: int, config: Fp8NormGemvConfig, norm: bool = True):
        from ember.compiler.ops.quant.fp8_norm_gemv import fp8_norm_gemv_kernel
        plan = launch_plan(self.out, self.inner, self.form, config, add=True, sizes=self.sizes)
        (values, scale), outs = self.weights[copy], self.outs[copy]
        fp8_norm_gemv_kernel[plan["grid"]](self.x if norm else self.h, self.y, self.g, values, scale, self.sum,
                                           *outs, EPS=EPS, ASM=True, NORM=norm, num_warps=plan["num_warps"],
                                           **plan["meta"])

    def seconds(self, launch_one) -> float:
        return time_graph(lambda: [launch_one(c) for c in range(len(self.weights))]) / len(self.weights)

    def results(self, copy: int = 0):
        import torch
        return self.sum.clone(), torch.cat([o.float() for o in self.outs[copy][:len(self.widths)]], dim=1)

    @property
    def widths(self):
        return self.sizes if self.form == "parts" else (self.out // 2,)


def agreement(case: Case, want) -> dict:
    import torch
    (sa, oa), (sb, ob) = case.results(), want
    ulps = (oa - ob).abs() / torch.clamp(ob.abs() * 2.0 ** -8, min=1e-30)
    return {"sum_equal": bool(torch.equal(sa, sb)), "max_ulps": round(float(ulps.max()), 2),
            "equal_frac": round(float((oa == ob).float().mean()), 4)}


def bench_case(form, out, inner, sizes, configs, bandwidth, rng) -> dict:
    case = Case(form, out, inner, sizes, rng)
    nbytes = out * inner + out * 4
    us = lambda t: round(t * 1e6, 2)  # noqa: E731
    frac = lambda t: round(nbytes / t / 1e9 / bandwidth, 3)  # noqa: E731
    case.norm()
    case.gemv(0)
    want = case.results()
    row = {"form": form, "shape": f"{out}x{inner}", "weight_mb": round(nbytes / 1e6, 1), "copies": len(case.weights)}
    t = case.seconds(lambda c: (case.norm(), case.gemv(c)))
    row.update(unfused_us=us(t), unfused_frac_copy=frac(t))
    row["norm_alone_us"] = us(case.seconds(lambda c: case.norm()))
    t = case.seconds(case.gemv)
    row.update(gemv_alone_us=us(t), gemv_alone_frac_copy=frac(t))
    print(json.dumps(row), flush=True)
    row["fused"] = []
    for config in configs:
        entry = dataclasses.asdict(config)
        try:
            case.fused(0, config)
            entry.update(agreement(case, want))
            t = case.seconds(lambda c: case.fused(c, config))
            entry.update(us=us(t), frac_copy=frac(t))
            entry["walk_alone_us"] = us(case.seconds(lambda c: case.fused(c, config, norm=False)))
        except Exception as error:  # one failing config must not lose the rest
            entry["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        print(json.dumps(entry), flush=True)
        row["fused"].append(entry)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args(argv)
    out_dir = Path(os.environ.get("OUT", "./out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth:.0f} GB/s", flush=True)
    result = {"copy_bandwidth_gb_s": round(bandwidth, 1), "timing": "CUDA graph of one launch (or pair) per weight "
              "copy, median replay / copies (tools/tune_gemv_graphs.py's method)", "cases": []}
    rng = np.random.default_rng(0)
    for form, out, inner, sizes in CASES:
        result["cases"].append(bench_case(form, out, inner, sizes, SWEEP if args.sweep else [Fp8NormGemvConfig()],
                                          bandwidth, rng))
        (out_dir / "fp8_norm_gemv.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
