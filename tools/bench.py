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


# Random weights at real shapes (`--model synthetic:<shape>`), for machines that cannot hold the real
# checkpoint; the tokenizer (only used to detokenize) comes from `--tokenizer DIR` (an HF folder).
SYNTHETIC_PREFIX = "synthetic:"
SYNTHETIC_SHAPES = {
    "qwen2.5-1.5b": ("qwen2", {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 1536, "num_hidden_layers": 28,
                               "num_attention_heads": 12, "num_key_value_heads": 2, "intermediate_size": 8960,
                               "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                               "max_position_embeddings": 32768, "tie_word_embeddings": True}),
    # a few-MB model of the same family, for smoke tests of the bench tools on any machine
    "qwen2-tiny": ("qwen2", {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                             "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                             "max_position_embeddings": 4096, "tie_word_embeddings": True}),
}


def _synthetic_model(shape: str, target: str, tokenizer_dir: str | None):
    from ..compiler.spec import spec_for_arch
    from ..runtime.loader.tokenizer import Tokenizer
    from ..runtime.model import load_model
    from ..runtime.synthetic import synthetic_checkpoint

    if shape not in SYNTHETIC_SHAPES:
        raise ValueError(f"unknown synthetic shape {shape!r} (known: {', '.join(SYNTHETIC_SHAPES)})")
    if tokenizer_dir is None:
        raise ValueError("a synthetic model needs --tokenizer DIR (an HF folder with tokenizer.json)")
    arch, config = SYNTHETIC_SHAPES[shape]
    return load_model(synthetic_checkpoint(spec_for_arch(arch), config), target=target), \
        Tokenizer.from_hf_dir(tokenizer_dir)


def load_bench_model(model_name: str, target: str, tokenizer_dir: str | None = None):
    """(Model, Tokenizer) for a known model name or `synthetic:<shape>`."""
    from ..runtime.loader.known_models import resolve_model
    from ..runtime.model import load_model
    from ..runtime.prompting import load_tokenizer

    if model_name.startswith(SYNTHETIC_PREFIX):
        return _synthetic_model(model_name[len(SYNTHETIC_PREFIX):], target, tokenizer_dir)
    model = load_model(resolve_model(model_name, progress=True), target=target, progress=True)
    return model, load_tokenizer(model.checkpoint)


def run_bench(model_name: str, *, target: str, concurrency: list[int], prompt_tokens: int, output_tokens: int,
              deterministic: bool, tokenizer_dir: str | None = None) -> dict:
    import jax

    from ..runtime.engine import Engine, EngineConfig

    started = time.perf_counter()
    model, tokenizer = load_bench_model(model_name, target, tokenizer_dir)
    load_s = time.perf_counter() - started
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
                       deterministic=args.deterministic, tokenizer_dir=args.tokenizer)
    print(json.dumps(result, indent=2))
    return 0
