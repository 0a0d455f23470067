"""`ember bench`: aggregate throughput through the engine at several concurrencies, JSON on stdout.

For each concurrency c, c requests (random prompt ids, seeded) are submitted at once, greedy with
ignore_eos, each generating exactly `output_tokens`. Reported per c: wall time, aggregate output tok/s
(all generated tokens / wall), decode tok/s (tokens after each request's first / time from the last
first-token to the end, i.e. the steady batched decode), TTFT p50/p99. Compilation is excluded: the
engine precompiles every step shape first (the time is reported), then one warm-up request runs.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np


def _commit() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _run_concurrent(engine, prompts: list[list[int]], output_tokens: int) -> dict:
    from ..runtime.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_tokens)
    start = time.perf_counter()
    streams = [engine.submit(p, params) for p in prompts]
    usages = []
    for stream in streams:
        for output in stream:
            if output.usage is not None:
                usages.append(output.usage)
    wall = time.perf_counter() - start
    generated = sum(u.completion_tokens for u in usages)
    last_first_token = max(u.ttft_s for u in usages)
    steady = wall - last_first_token
    ttft = np.array([u.ttft_s for u in usages])
    return {
        "concurrency": len(prompts), "wall_s": round(wall, 2), "generated_tokens": generated,
        "output_tokens_per_s": round(generated / wall, 2),
        "decode_tokens_per_s": round(len(prompts) * (output_tokens - 1) / steady, 2) if steady > 0 else None,
        "ttft_p50_s": round(float(np.percentile(ttft, 50)), 2), "ttft_p99_s": round(float(np.percentile(ttft, 99)), 2),
    }


def run_bench(model_name: str, *, target: str, concurrency: list[int], prompt_tokens: int, output_tokens: int,
              deterministic: bool) -> dict:
    import jax

    from ..runtime.engine import Engine, EngineConfig
    from ..runtime.loader.known_models import resolve_model
    from ..runtime.model import load_model
    from ..runtime.prompting import load_tokenizer

    path = resolve_model(model_name, progress=True)
    started = time.perf_counter()
    model = load_model(path, target=target, progress=True)
    load_s = time.perf_counter() - started
    tokenizer = load_tokenizer(model.checkpoint)
    context = prompt_tokens + output_tokens
    top = max(concurrency)
    config = EngineConfig(num_blocks=top * (-(-context // 16) + 1) + 1, max_model_len=context, max_num_seqs=top,
                          max_batched_tokens=512, deterministic=deterministic, enable_prefix_caching=False)
    engine = Engine(model, tokenizer, config)
    try:
        compile_s = engine.precompile(progress=True)
        rng = np.random.default_rng(0)
        vocab = int(model.dims.vocab)
        _run_concurrent(engine, [rng.integers(0, vocab, prompt_tokens).tolist()], 2)  # warm-up
        runs = [_run_concurrent(engine, [rng.integers(0, vocab, prompt_tokens).tolist() for _ in range(c)],
                                output_tokens) for c in concurrency]
    finally:
        engine.close()
    return {
        "model": model_name, "arch": model.spec.arch, "target": target, "commit": _commit(),
        "machine": f"{platform.machine()}, {jax.device_count()} {jax.devices()[0].platform} device(s)",
        "deterministic": deterministic, "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "load_s": round(load_s, 1), "precompile_s": round(compile_s, 1), "runs": runs,
    }


def main_bench(args) -> int:
    result = run_bench(args.model, target=args.target, concurrency=args.concurrency,
                       prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                       deterministic=args.deterministic)
    print(json.dumps(result, indent=2))
    return 0
