"""Batch-1 decode steps through jax.jit's own dispatch against the executables compiled ahead (CompiledSteps),
interleaved in one process so that the machine's load falls on both alike.

    .venv/bin/python -m ember.tools.dev.probe_compiled_dispatch [--model NAME] [--repeats 6]

The executor now calls every cpu step through `lower().compile()` executables (runtime/execution/
compiled_steps.py); this checks that a decode step costs what it cost through jit (the same program).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    from ember.runtime.engine.config import EngineConfig, prefill_shapes
    from ember.runtime.execution.engine_step import pack_step_inputs
    from ember.runtime.execution.step_executor import StepExecutor
    from ember.runtime.execution.step_inputs import StepShape, padding_batch
    from ember.runtime.loading.known_models import resolve_model
    from ember.runtime.loading.model import load_model

    model = load_model(resolve_model(args.model))
    config = EngineConfig(num_blocks=256, max_model_len=4096, max_num_seqs=16, max_batched_tokens=512)
    executor = StepExecutor(model, config, prefill_shapes(model.plan.manifest["entries"]["forward"], config, False))
    shape = StepShape(1, 0, executor.table_blocks, executor.num_kinds)
    inputs = pack_step_inputs(padding_batch(shape), [], vocab_size=executor.vocab, num_rows=shape.logit_rows)
    static = (model.dims, *inputs.static_args())
    paths = {"jit": executor.step_fn.fn, "compiled_ahead": executor.step_fn}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for round_ in range(args.repeats + 1):  # the first round compiles (or reads JAX's cache): not timed
        for name, fn in paths.items():
            begun = time.perf_counter()
            packed, executor.kv = fn(*static, model.params, executor.kv, inputs.buffer)
            jax.block_until_ready(packed)
            if round_:
                times[name].append(time.perf_counter() - begun)
    result = {
        "model": args.model,
        "step": "decode, 1 row",
        **{f"{name}_ms_min": round(1e3 * min(t), 1) for name, t in times.items()},
        **{f"{name}_ms_median": round(1e3 * sorted(t)[len(t) // 2], 1) for name, t in times.items()},
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
