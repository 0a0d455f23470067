"""`ember bench`: aggregate throughput through the engine at several concurrencies, JSON on stdout.

For each concurrency c, c requests (random prompt ids, seeded) are submitted at once, greedy with
ignore_eos, each generating exactly `output_tokens`. Reported per c: wall time, aggregate output tok/s
(all generated tokens / wall), decode tok/s (tokens after each request's first / time from the last
first-token to the end, i.e. the steady batched decode), TTFT p50/p99. Compilation is excluded: the
engine precompiles every step shape first (the time is reported), then one warm-up request runs.

The models (`synthetic:<shape>[-<format>]` names) are tools/bench_models.py's; the measuring helpers, which
the benchmark suite (tools/bench_suite.py, `ember bench --suite`) shares, tools/bench_measure.py's.
"""

from __future__ import annotations

import json
import platform
import time

import numpy as np

from .bench_measure import git_commit, run_concurrent
from .bench_models import load_bench_model
from .cli import mesh_from_args


def run_bench(
    model_name: str,
    *,
    target: str,
    concurrency: list[int],
    prompt_tokens: int,
    output_tokens: int,
    deterministic: bool,
    tokenizer_dir: str | None = None,
    kv_cache_dtype: str = "auto",
    kernel_policy: str | None = None,
    precision: str = "fast",
    speculative=None,
    mesh=None,
) -> dict:
    import jax

    from ..runtime.engine.engine import Engine, EngineConfig

    started = time.perf_counter()
    model, tokenizer = load_bench_model(model_name, target, tokenizer_dir, kernel_policy, precision, mesh)
    load_s = time.perf_counter() - started
    context = prompt_tokens + output_tokens
    top = max(concurrency)
    config = EngineConfig(
        num_blocks=top * (-(-context // 16) + 1) + 1,
        max_model_len=context,
        max_num_seqs=top,
        max_batched_tokens=512,
        deterministic=deterministic,
        enable_prefix_caching=False,
        kv_cache_dtype=kv_cache_dtype,
        speculative=speculative,
    )
    engine = Engine(model, tokenizer, config)
    try:
        compile_s = engine.precompile(progress=True)
        rng = np.random.default_rng(0)
        vocab = int(model.dims.vocab)
        run_concurrent(engine, [rng.integers(0, vocab, prompt_tokens).tolist()], 2)  # warm-up
        runs = [
            run_concurrent(engine, [rng.integers(0, vocab, prompt_tokens).tolist() for _ in range(c)], output_tokens)
            for c in concurrency
        ]
    finally:
        engine.close()
    return {
        "model": model_name,
        "arch": model.spec.arch,
        "target": target,
        "commit": git_commit(),
        "machine": f"{platform.machine()}, {jax.device_count()} {jax.devices()[0].platform} device(s)",
        "deterministic": deterministic,
        "kv_cache_dtype": kv_cache_dtype,
        "precision": precision,
        "mesh": model.mesh.to_dict(),
        "speculative": None if speculative is None else vars(speculative),
        "kernel_policy": model.policy.to_dict(),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "load_s": round(load_s, 1),
        "precompile_s": round(compile_s, 1),
        "runs": runs,
    }


def speculative_from_args(args):
    """`--speculative`, `--draft-model`, `--num-speculative-tokens` (generate, bench) as a SpeculativeConfig."""
    from ..runtime.speculative.config import speculative_config

    return speculative_config(args.speculative, args.draft_model, args.num_speculative_tokens, args.model)


def main_bench(args) -> int:
    result = run_bench(
        args.model,
        target=args.target,
        concurrency=args.concurrency or [1, 4, 16],
        prompt_tokens=args.prompt_tokens or 256,
        output_tokens=args.output_tokens or 128,
        deterministic=args.deterministic,
        tokenizer_dir=args.tokenizer,
        kv_cache_dtype=args.kv_cache_dtype or "auto",
        kernel_policy=args.kernel_policy,
        precision=args.precision,
        speculative=speculative_from_args(args),
        mesh=mesh_from_args(args),
    )
    print(json.dumps(result, indent=2))
    return 0
