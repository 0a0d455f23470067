"""`ember bench`: single-stream decode and prefill throughput of one model, as JSON on stdout.

Compilation is excluded: every step shape is run once before timing. Prompt tokens are random ids
(seeded) so the figure does not depend on a text; decode feeds back greedy tokens.
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


def run_bench(model_name: str, *, target: str, prompt_tokens: int, decode_tokens: int, repeats: int) -> dict:
    import jax

    from ..runtime.loader.known_models import resolve_model
    from ..runtime.model import load_model
    from ..runtime.sequence_runner import SequenceRunner

    path = resolve_model(model_name, progress=True)
    model = load_model(path, target=target, progress=True)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, int(model.dims.vocab), size=prompt_tokens).tolist()
    capacity = prompt_tokens + decode_tokens + 1

    def one_run() -> tuple[float, float]:
        runner = SequenceRunner(model, capacity)
        start = time.perf_counter()
        logits = runner.prefill(prompt)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(decode_tokens):
            logits = runner.decode(int(np.argmax(logits)))
        return prefill_s, time.perf_counter() - start

    one_run()  # compiles every shape used below
    runs = [one_run() for _ in range(repeats)]
    prefill_s = min(r[0] for r in runs)
    decode_s = min(r[1] for r in runs)
    weight_bytes = sum(int(np.prod(a.shape)) * a.dtype.itemsize
                       for group in (model.params.globals, *model.params.layers) for a in group.values())
    return {
        "model": model_name, "arch": model.spec.arch, "target": target, "commit": _commit(),
        "machine": f"{platform.machine()}, {jax.device_count()} {jax.devices()[0].platform} device(s)",
        "prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens, "repeats": repeats,
        "prefill_tokens_per_s": round(prompt_tokens / prefill_s, 2),
        "decode_tokens_per_s": round(decode_tokens / decode_s, 3),
        "decode_ms_per_token": round(1000 * decode_s / decode_tokens, 1),
        "weight_bytes_read_per_token": weight_bytes,
        "effective_weight_bandwidth_gb_s": round(weight_bytes * decode_tokens / decode_s / 1e9, 2),
    }


def main_bench(args) -> int:
    result = run_bench(args.model, target=args.target, prompt_tokens=args.prompt_tokens,
                       decode_tokens=args.decode_tokens, repeats=args.repeats)
    print(json.dumps(result, indent=2))
    return 0
