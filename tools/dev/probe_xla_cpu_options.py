"""Compile seconds and step milliseconds of one real step shape under XLA:CPU compiler options.

    .venv/bin/python -m ember.tools.dev.probe_xla_cpu_options [--model NAME] [--tokens 0] [--rows 1]

Loads the model as `ember serve` does (fp32 on the cpu target), builds the engine's step executor, then for
each option set compiles the step of (rows decode rows, tokens prefill tokens) with JAX's persistent cache off
and times its run on a padding batch (fastest of --repeats). The question: how much of a step shape's compile
is LLVM optimising the fusions (xla_backend_optimization_level), and what the step pays for less of it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax

OPTION_SETS = {
    "default": {},
    "backend_O1": {"xla_backend_optimization_level": 1},
    "backend_O0": {"xla_backend_optimization_level": 0},
    "no_expensive_llvm": {"xla_llvm_disable_expensive_passes": True},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sets", default=",".join(OPTION_SETS))
    args = parser.parse_args()
    from ember.runtime.engine.config import EngineConfig, prefill_shapes
    from ember.runtime.execution.engine_step import pack_step_inputs
    from ember.runtime.execution.step_executor import StepExecutor
    from ember.runtime.execution.step_inputs import StepShape, padding_batch
    from ember.runtime.loading.known_models import resolve_model
    from ember.runtime.loading.model import load_model

    model = load_model(resolve_model(args.model))
    jax.config.update("jax_enable_compilation_cache", False)
    config = EngineConfig(num_blocks=256, max_model_len=4096, max_num_seqs=16, max_batched_tokens=512)
    executor = StepExecutor(model, config, prefill_shapes(model.plan.manifest["entries"]["forward"], config, False))
    shape = StepShape(args.rows, args.tokens, executor.table_blocks, executor.num_kinds)
    inputs = pack_step_inputs(padding_batch(shape), [], vocab_size=executor.vocab, num_rows=shape.logit_rows)
    layout, num_top, greedy = inputs.static_args()
    fn = executor.step_fn.fn
    results = {"model": args.model, "rows": args.rows, "tokens": args.tokens}
    for name in args.sets.split(","):
        started = time.perf_counter()
        lowered = fn.lower(model.dims, layout, num_top, greedy, model.params, executor.kv, inputs.buffer)
        lower_s = time.perf_counter() - started
        compiled = lowered.compile(compiler_options=OPTION_SETS[name])
        compile_s = time.perf_counter() - started - lower_s
        times = []
        for _ in range(args.repeats + 1):
            begun = time.perf_counter()
            packed, executor.kv = compiled(model.params, executor.kv, inputs.buffer)
            jax.block_until_ready(packed)
            times.append(time.perf_counter() - begun)
        results[name] = {
            "lower_s": round(lower_s, 2),
            "compile_s": round(compile_s, 2),
            "step_ms_min": round(1e3 * min(times[1:]), 1),
            "load_average": [round(v, 2) for v in os.getloadavg()],
        }
        print(name, results[name], flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
