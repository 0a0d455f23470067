"""The benchmark suite's measurements that need a fresh process: cold and warm start, and HF transformers.

- Startup: `python -m ember.tools.bench_processes startup-child ...` loads a model, builds an engine and
  precompiles every step shape, then prints {load_s, precompile_s, shapes} as its last stdout line. Run
  once with an empty JAX compilation cache (cold) and once more with the cache it filled (warm); the warm
  child's wall time, process start to exit, is the warm start time.
- HF: tools/bench_hf.py under the Python that has torch (it imports nothing from Ember).
Each child gets a timeout; a child that fails or times out gives {"error": ...} (stderr's tail).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def run_child(cmd: list[str], env: dict, timeout: float, json_file: Path | None = None) -> dict:
    """Run a measuring subprocess; its JSON result (its last stdout line, or json_file) and its wall time."""
    # the suite's process holds GPU memory beside the child: neither may take 75% of it at start (XLA's default)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    begun = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s: {' '.join(cmd[:6])} ..."}
    wall = round(time.perf_counter() - begun, 1)
    try:
        text = json_file.read_text() if json_file is not None else proc.stdout.strip().splitlines()[-1]
        return {**json.loads(text), "wall_s": wall}
    except (OSError, IndexError, ValueError):
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}", "wall_s": wall}


def measure_startup(
    model: str,
    target: str,
    tokenizer_dir: str | None,
    engine: dict,
    timeout: Callable[[], float],
    kernel_policy: str | None = None,
) -> dict:
    """Cold compile then warm start of `model` with EngineConfig(**engine), each in a fresh process.
    The compiled plans are then copied into this process's JAX cache (if it has one), so the suite's own
    engine of the same config loads them instead of compiling them again."""
    import jax

    from ..runtime.execution.executable_cache import DIRECTORY
    from ..runtime.loading.model import enable_compilation_cache

    enable_compilation_cache()
    cmd = [
        sys.executable,
        "-m",
        "ember.tools.bench_processes",
        "startup-child",
        "--model",
        model,
        "--target",
        target,
        "--engine",
        json.dumps(engine),
    ] + (["--tokenizer", tokenizer_dir] if tokenizer_dir else [])
    cmd += ["--kernel-policy", kernel_policy] if kernel_policy else []
    fresh = Path(tempfile.mkdtemp(prefix="ember-bench-jax-cache-"))
    try:
        # cold: XLA's persistent cache and Triton's kernel cache both start empty
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(fresh), "TRITON_CACHE_DIR": str(fresh / "triton")}
        cold = run_child(cmd, dict(env), timeout())
        warm = run_child(cmd, dict(env), timeout())
        shared = jax.config.jax_compilation_cache_dir
        if shared:
            shutil.copytree(fresh, shared, dirs_exist_ok=True, ignore=shutil.ignore_patterns("triton", DIRECTORY))
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return {
        "engine": engine,
        "cold": cold,
        "warm": warm,
        "cold_compile_s": cold.get("precompile_s"),
        "warm_start_s": warm.get("wall_s"),
        "warm_precompile_s": warm.get("precompile_s"),
    }


def measure_hf(
    config: dict,
    *,
    batches,
    prompt_tokens: int,
    new_tokens: int,
    device: str,
    compile_mode: str,
    python: str,
    timeout: float,
) -> dict:
    """tools/bench_hf.py on an HF config (a synthetic shape's), in a subprocess under `python`."""
    with tempfile.TemporaryDirectory(prefix="ember-bench-hf-") as tmp:
        config_path, out_path = Path(tmp) / "config.json", Path(tmp) / "hf.json"
        config_path.write_text(json.dumps(config))
        cmd = [
            python,
            str(Path(__file__).with_name("bench_hf.py")),
            "--config",
            str(config_path),
            "--batch",
            *map(str, batches),
            "--prompt-tokens",
            str(prompt_tokens),
            "--new-tokens",
            str(new_tokens),
            "--device",
            device,
            "--compile",
            compile_mode,
            "--out",
            str(out_path),
        ]
        return run_child(cmd, dict(os.environ), timeout, json_file=out_path)


def startup_child(argv: list[str]) -> int:
    """Load the model, build the engine, precompile every step shape; one JSON line on stdout."""
    parser = argparse.ArgumentParser(prog="bench_processes startup-child")
    parser.add_argument("--model", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--tokenizer")
    parser.add_argument("--kernel-policy")
    parser.add_argument("--engine", required=True, help="EngineConfig fields as JSON")
    args = parser.parse_args(argv)
    from ..runtime.engine.engine import Engine, EngineConfig
    from .bench_models import load_bench_model

    begun = time.perf_counter()
    model, tokenizer = load_bench_model(args.model, args.target, args.tokenizer, args.kernel_policy)
    load_s = time.perf_counter() - begun
    engine = Engine(model, tokenizer, EngineConfig(**json.loads(args.engine)))
    try:
        precompile_s = engine.precompile()
        shapes = engine.executor.shapes()
        # decode-only shapes also compile a several-steps-per-call variant where the engine runs ahead
        ahead = (
            sum(1 for s in shapes if s.prefill_tokens == 0) if getattr(engine.executor, "multi_step_fn", None) else 0
        )
    finally:
        engine.close()
    print(
        json.dumps(
            {
                "load_s": round(load_s, 1),
                "precompile_s": round(precompile_s, 1),
                "shapes": len(shapes),
                "executables": len(shapes) + ahead,
            }
        )
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["startup-child"]:
        sys.exit(startup_child(sys.argv[2:]))
    sys.exit("usage: python -m ember.tools.bench_processes startup-child --model M --target T --engine JSON")
