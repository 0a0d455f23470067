"""Batch-1 decode of one GGUF on the cpu target, weights kept as int8 blocks (the native kernel), as int8 blocks
with Q4_K's codes two per byte (`nibble_blocks`), and every weight fp32 (`--precision exact`), loaded in one process and their decode steps interleaved (the machine is
shared: A and B see the same neighbours). Prints one JSON object; check `free -g` first (the 1.5B takes ~1.9 GB
kept quantized plus ~7.1 GB in fp32). `--rest` adds a third copy of the int8-block model whose projections call a
kernel that only zeroes its output: its step time is the rest of a decode step (attention, norms, sampling, host).

  .venv/bin/python -m ember.tools.dev.bench_cpu_decode_ab ~/.cache/ember/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ember.compiler.kernels.cpu_gemv import native
from ember.compiler.targets.cpu import CPU, CPU_INT8_BLOCKS, CPU_NIBBLE_BLOCKS
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model

PROMPT = 32  # tokens prefilled before the timed decode steps

# the projections' FFI call with no work but zeroing y [N, O] (the same operands as block_q8.cc's)
NULL_KERNEL = r"""
#include <cstring>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
static ffi::Error Null(ffi::Buffer<ffi::F32>, ffi::Buffer<ffi::S8>, ffi::Buffer<ffi::F32>, ffi::Buffer<ffi::F32>,
                       ffi::ResultBuffer<ffi::F32> y) {
  std::memset(y->typed_data(), 0, y->element_count() * sizeof(float));
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(EmberNullMatmul, Null, ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>()
    .Arg<ffi::Buffer<ffi::S8>>().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
"""


def register_null_kernel() -> str:
    import jax

    workdir = Path(tempfile.mkdtemp(prefix="ember-null-kernel-"))
    (workdir / "null.cc").write_text(NULL_KERNEL)
    command = [native._compiler(), *native.FLAGS, "-w", "-isystem", jax.ffi.include_dir()]
    subprocess.run([*command, str(workdir / "null.cc"), "-o", str(workdir / "null.so")], check=True)
    library = ctypes.cdll.LoadLibrary(str(workdir / "null.so"))
    jax.ffi.register_ffi_target("ember_null_matmul", jax.ffi.pycapsule(library.EmberNullMatmul), platform="cpu")
    return "ember_null_matmul"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf")
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps per variant")
    parser.add_argument(
        "--only", nargs="+", choices=("int8_blocks", "nibble_blocks", "fp32"), help="load these variants only"
    )
    parser.add_argument("--rest", action="store_true", help="also time the step with no-op projections")
    args = parser.parse_args(argv)

    def blocks(weights) -> dict:
        return {"kernel_policy": dataclasses.replace(CPU.policy, weights=weights)}

    int8 = blocks(CPU_INT8_BLOCKS)
    setups = {"int8_blocks": int8, "nibble_blocks": blocks(CPU_NIBBLE_BLOCKS), "fp32": {"precision": "exact"}}
    if args.only:
        setups = {name: setups[name] for name in args.only}
    if args.rest:
        setups["rest_without_projections"] = int8
    runners, report = {}, {"load_avg_start": [round(v, 2) for v in os.getloadavg()], "variants": {}}
    real_target = native.TARGET
    for name, kwargs in setups.items():
        # the plans trace at the first step, reading native.TARGET then: each model keeps the kernel it traced with
        native.TARGET = register_null_kernel() if name == "rest_without_projections" else real_target
        start = time.perf_counter()
        model = load_model(args.gguf, target="cpu", **kwargs)
        loaded = time.perf_counter() - start
        runner = SequenceRunner(model, PROMPT + 2 * args.steps + 8)
        start = time.perf_counter()
        logits = runner.prefill(list(range(100, 100 + PROMPT)))
        runner.decode(int(np.argmax(logits)))  # compiles the decode step
        report["variants"][name] = {
            "load_s": round(loaded, 1),
            "first_prefill_decode_s": round(time.perf_counter() - start, 1),
        }
        runners[name] = runner
    times = {name: [] for name in runners}
    tokens = {name: 200 for name in runners}
    for _ in range(args.steps):
        for name, runner in runners.items():
            start = time.perf_counter()
            tokens[name] = int(np.argmax(runner.decode(tokens[name])))
            times[name].append(time.perf_counter() - start)
    for name, t in times.items():
        ms = np.asarray(t) * 1e3
        report["variants"][name].update(
            decode_ms_min=round(float(ms.min()), 1),
            decode_ms_median=round(float(np.median(ms)), 1),
            tok_s_best=round(1e3 / float(ms.min()), 2),
            tok_s_median=round(1e3 / float(np.median(ms)), 2),
        )
    report["load_avg_end"] = [round(v, 2) for v in os.getloadavg()]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
