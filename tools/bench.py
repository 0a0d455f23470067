"""`ember bench`: aggregate throughput through the engine at several concurrencies, JSON on stdout.

For each concurrency c, c requests (random prompt ids, seeded) are submitted at once, greedy with
ignore_eos, each generating exactly `output_tokens`. Reported per c: wall time, aggregate output tok/s
(all generated tokens / wall), decode tok/s (tokens after each request's first / time from the last
first-token to the end, i.e. the steady batched decode), TTFT p50/p99. Compilation is excluded: the
engine precompiles every step shape first (the time is reported), then one warm-up request runs.

Also what the benchmark suite (tools/bench_suite.py, `ember bench --suite`) shares with it: the models
(`synthetic:<shape>[-<format>]` names), and the bytes a decode step reads (weights, KV) for rooflines.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

from ..compiler.spec import gathered_only_weights


def _commit() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _run_concurrent(engine, prompts: list[list[int]], output_tokens: int) -> dict:
    from ..runtime.sampling.params import SamplingParams

    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_tokens)
    start = time.perf_counter()
    streams = [engine.submit(p, params) for p in prompts]
    usages = []
    for stream in streams:
        for output in stream:
            if output.error:  # the engine ended the request (e.g. a step failed): no figure for this run
                raise RuntimeError(output.error)
            if output.usage is not None:
                usages.append(output.usage)
    wall = time.perf_counter() - start
    generated = sum(u.completion_tokens for u in usages)
    last_first_token = max(u.ttft_s for u in usages)
    steady = wall - last_first_token
    ttft = np.array([u.ttft_s for u in usages])
    return {
        "concurrency": len(prompts),
        "wall_s": round(wall, 2),
        "generated_tokens": generated,
        "output_tokens_per_s": round(generated / wall, 2),
        "decode_tokens_per_s": round(len(prompts) * (output_tokens - 1) / steady, 2) if steady > 0 else None,
        "ttft_p50_s": round(float(np.percentile(ttft, 50)), 2),
        "ttft_p99_s": round(float(np.percentile(ttft, 99)), 2),
    }


# Random weights at real shapes (`--model synthetic:<shape>[-<format>]`), for machines that cannot hold the real
# checkpoint; the tokenizer (only used to detokenize) comes from `--tokenizer DIR` (an HF folder). Configs use
# HF config.json keys (model_type included, so tools/bench_hf.py builds the same shape in transformers).
SYNTHETIC_PREFIX = "synthetic:"
_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}
SYNTHETIC_SHAPES = {
    "qwen2.5-1.5b": (
        "qwen2",
        {
            **_QWEN2,
            "hidden_size": 1536,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "intermediate_size": 8960,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
        },
    ),
    # Llama-3-8B's shape; Llama 3.1's rope scaling and context length, so contexts to 32k are in range
    "llama3-8b": (
        "llama",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 14336,
            "vocab_size": 128256,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
    ),
    # a few-MB model of the same family, for smoke tests of the bench tools on any machine
    "qwen2-tiny": (
        "qwen2",
        {
            **_QWEN2,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 151936,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
        },
    ),
}
# `<shape>-<format>`: weights in a quantized checkpoint layout (random values, the real block layout), made by
# ember.runtime.loading.synthetic_gguf; without a suffix, float weights in the target's activation dtype.
# `-fp8` / `-fp8_block`: the layers' projections in FP8 e4m3 with per-channel / 128 x 128 block scales
# (compiler/ops/quant/fp8.py), drawn by ember.runtime.loading.synthetic on targets whose projections take them.
QUANTIZED_FORMATS = ("q4_k_m", "fp8", "fp8_block")


def parse_synthetic(name: str) -> tuple[str, str | None]:
    """'synthetic:llama3-8b-q4_k_m' -> ('llama3-8b', 'q4_k_m'); 'synthetic:llama3-8b' -> ('llama3-8b', None)."""
    rest = name[len(SYNTHETIC_PREFIX) :] if name.startswith(SYNTHETIC_PREFIX) else name
    for fmt in QUANTIZED_FORMATS:
        if rest.endswith(f"-{fmt}") and rest[: -len(fmt) - 1] in SYNTHETIC_SHAPES:
            return rest[: -len(fmt) - 1], fmt
    if rest not in SYNTHETIC_SHAPES:
        known = [*SYNTHETIC_SHAPES, *(f"{s}-{f}" for s in SYNTHETIC_SHAPES for f in QUANTIZED_FORMATS)]
        raise ValueError(f"unknown synthetic shape {rest!r} (known: {', '.join(known)})")
    return rest, None


def _synthetic_model(name: str, target: str, tokenizer_dir: str | None, kernel_policy: str | None):
    from ..compiler.spec import spec_for_arch
    from ..runtime.loading.model import load_model
    from ..runtime.loading.synthetic import synthetic_model
    from ..runtime.loading.text.tokenizer import Tokenizer

    shape, fmt = parse_synthetic(name)
    if tokenizer_dir is None:
        raise ValueError("a synthetic model needs --tokenizer DIR (an HF folder with tokenizer.json)")
    arch, config = SYNTHETIC_SHAPES[shape]
    spec = spec_for_arch(arch)
    if fmt is None or fmt.startswith("fp8"):
        model = synthetic_model(spec, config, target=target, weight_format=fmt, kernel_policy=kernel_policy)
    else:
        try:
            from ..runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint
        except ImportError as error:
            raise ValueError(
                f"{name} needs ember.runtime.loading.synthetic_gguf (synthetic GGUF checkpoints in the "
                f"{fmt} layout), which this tree does not have: {error}"
            ) from None
        checkpoint = synthetic_gguf_checkpoint(spec, config, scheme=fmt, seed=0)
        model = load_model(checkpoint, target=target, kernel_policy=kernel_policy)
    return model, Tokenizer.from_hf_dir(tokenizer_dir)


def load_bench_model(model_name: str, target: str, tokenizer_dir: str | None = None, kernel_policy: str | None = None):
    """(Model, Tokenizer) for a known model name or `synthetic:<shape>[-<format>]`; kernel_policy: a JSON file
    of overrides over the target's kernel policy (compiler/targets/policy.py)."""
    from ..runtime.loading.known_models import resolve_model
    from ..runtime.loading.model import load_model
    from ..runtime.loading.text.prompting import load_tokenizer

    if model_name.startswith(SYNTHETIC_PREFIX):
        return _synthetic_model(model_name, target, tokenizer_dir, kernel_policy)
    model = load_model(
        resolve_model(model_name, progress=True), target=target, progress=True, kernel_policy=kernel_policy
    )
    return model, load_tokenizer(model.checkpoint)


def weight_bytes_per_step(model, rows: int = 1) -> int:
    """Bytes of weights one decode step of `rows` rows reads: every weight array the plan holds on the device
    (quantized blocks at their packed size), except an embedding table it only gathers a few rows from; of a
    weight with a dense copy, the form a step of that many rows reads (linear_quant.form_for_rows). A tied
    head has its own array under the head's name, so it counts; an array shared by two names counts once."""
    import jax

    from ..compiler.ops.linear_quant import form_for_rows

    gathered = gathered_only_weights(model.spec)
    seen: dict[int, int] = {}
    groups = [{k: v for k, v in model.params.globals.items() if k.split(".")[0] not in gathered}, *model.params.layers]
    for group in groups:
        for leaf in jax.tree.leaves({k: form_for_rows(rows, v) for k, v in group.items()}):
            seen[id(leaf)] = int(leaf.nbytes)
    return sum(seen.values())


def kv_bytes_read(model, context: int, kv_cache_dtype: str = "auto") -> int:
    """K and V bytes one decode step of one sequence reads at `context` tokens: per layer
    min(context, its window) x hkv x dh x 2 x itemsize (of the KV pools' dtype)."""
    from ..runtime.engine.config import kv_dtype

    d = model.dims
    windows = {kind.name: kind.window for kind in model.paged_kinds}
    per_token = int(d.hkv) * int(d.dh) * 2 * kv_dtype(model, kv_cache_dtype).itemsize
    return sum(min(context, windows[k] or context) * per_token for k in model.layer_state_kinds)


# ---- measuring helpers of the suite (tools/bench_suite.py) ------------------------------------------------


class StepClock:
    """When each engine device call finished, with the decode tokens it made, its decode steps and whether
    it held a prefill chunk. Wraps the engine's executor.launch and executor.collect: a call is timed when its
    results reach the host (the engine launches a call, then waits for it through collect)."""

    def __init__(self, engine):
        self.steps: list[tuple[float, int, int, bool]] = []  # (finished at, decode tokens, steps, prefill?)
        self.launches: list[tuple[float, float, bool, bool]] = []  # host: (began, returned, chained?, prefill?)
        executor = engine.executor
        executor.launch = self._timed_launch(executor.launch)
        executor.collect = self._timed_collect(executor.collect)

    def reset(self) -> None:
        self.steps.clear()
        self.launches.clear()

    def _timed_launch(self, launch):
        def timed(step, rows, steps, **kwargs):
            began = time.perf_counter()
            in_flight = launch(step, rows, steps, **kwargs)
            chained = kwargs.get("after") is not None
            self.launches.append((began, time.perf_counter(), chained, bool(step.prefills)))
            return in_flight

        return timed

    def _timed_collect(self, collect):
        def timed(in_flight):
            result = collect(in_flight)
            step = in_flight.step
            self.steps.append((time.perf_counter(), step.num_decode * len(result), len(result), bool(step.prefills)))
            return result

        return timed

    def decode_after_prefill(self) -> tuple[int, float, int]:
        """(tokens of the decode-only steps after the last prefill step, their time in seconds, how many
        steps): tokens / steps is the mean batch those steps ran."""
        last_prefill = max((t for t, _, _, pre in self.steps if pre), default=None)
        decodes = [(t, n, k) for t, n, k, pre in self.steps if not pre and (last_prefill is None or t > last_prefill)]
        if last_prefill is None or not decodes:
            return 0, 0.0, 0
        return sum(n for _, n, _ in decodes), decodes[-1][0] - last_prefill, sum(k for _, _, k in decodes)

    def decode_call_ends_ms(self) -> list[float]:
        """When each decode-only call after the last prefill step reached the host, in ms after that step's
        results did: the first entry is the device's gap after the prefill plus one call, the steps between
        entries one call each (where the host kept the device busy, a call's device time)."""
        last_prefill = max((t for t, _, _, pre in self.steps if pre), default=None)
        if last_prefill is None:
            return []
        return [round((t - last_prefill) * 1e3, 2) for t, _, _, pre in self.steps if not pre and t > last_prefill]

    def first_decode_launch_ms(self) -> dict:
        """The host's side of the gap after the last prefill step: when the call after it began launching
        (ms after the prefill's results reached the host; negative: dispatched behind the prefill, before its
        tokens were read), how long that launch took, and whether it was chained."""
        last_prefill = max((t for t, _, _, pre in self.steps if pre), default=None)
        prefill_launches = [i for i, (*_, pre) in enumerate(self.launches) if pre]
        if last_prefill is None or not prefill_launches or prefill_launches[-1] + 1 >= len(self.launches):
            return {}
        after = self.launches[prefill_launches[-1] + 1 :]
        began, returned, chained, _ = after[0]
        return {
            "began_ms": round((began - last_prefill) * 1e3, 2),
            "launch_ms": round((returned - began) * 1e3, 2),
            "chained": chained,
            "launch_ms_all": [round((b - a) * 1e3, 2) for a, b, _, _ in after[:4]],
        }


def single_request(engine, prompt: list[int], max_tokens: int):
    """Run one greedy request to its end; its Usage. Raises if the engine ended it with an error."""
    from ..runtime.sampling.params import SamplingParams

    usage = None
    for output in engine.submit(prompt, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)):
        if output.error:
            raise RuntimeError(output.error)
        usage = output.usage or usage
    return usage


def model_facts(model, kv_cache_dtype: str = "auto") -> dict:
    """What the report says about a loaded model: its weight bytes (per step, and by dtype), KV dtype, dims."""
    import jax

    from ..runtime.engine.config import kv_dtype

    dtypes: dict[str, int] = {}
    for leaf in jax.tree.leaves((model.params.globals, model.params.layers)):
        dtypes[str(leaf.dtype)] = dtypes.get(str(leaf.dtype), 0) + int(leaf.nbytes)
    dims = model.dims.as_dict()
    return {
        "arch": model.spec.arch,
        "checkpoint_format": model.checkpoint.format,
        "weight_bytes_per_step": weight_bytes_per_step(model),
        "weight_bytes_by_dtype": dtypes,
        "kv_dtype": str(kv_dtype(model, kv_cache_dtype)),
        "dims": {k: int(dims[k]) for k in ("layers", "d", "hq", "hkv", "dh", "ffn", "vocab") if k in dims},
    }


def apply_rooflines(result: dict, bandwidth_gb_s: float | None) -> None:
    """Roofline of every decode figure (Ember's context and concurrency runs, HF's runs) from its measured
    rate, bytes read per step and rows per step, with the run's bandwidth (the highest copy or read
    bandwidth measured in the run, tools/hbm_probe.py: the strictest roofline)."""
    runs = [
        run
        for entry in result.get("models", {}).values()
        for section in ("context", "concurrency")
        if isinstance(entry.get(section), dict)
        for run in entry[section].get("runs", [])
    ]
    runs += [run for hf in result.get("hf", {}).values() for run in hf.get("runs", [])]
    for run in runs:
        rate = run.get("decode_tokens_per_s")
        if not rate or not bandwidth_gb_s or "bytes_per_step" not in run:
            continue
        roofline = run["decode_rows"] * bandwidth_gb_s * 1e9 / run["bytes_per_step"]
        run.update(
            bandwidth_gb_s=bandwidth_gb_s,
            roofline_tokens_per_s=round(roofline, 1),
            roofline_fraction=round(rate / roofline, 4),
        )


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
) -> dict:
    import jax

    from ..runtime.engine.engine import Engine, EngineConfig

    started = time.perf_counter()
    model, tokenizer = load_bench_model(model_name, target, tokenizer_dir, kernel_policy)
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
    )
    engine = Engine(model, tokenizer, config)
    try:
        compile_s = engine.precompile(progress=True)
        rng = np.random.default_rng(0)
        vocab = int(model.dims.vocab)
        _run_concurrent(engine, [rng.integers(0, vocab, prompt_tokens).tolist()], 2)  # warm-up
        runs = [
            _run_concurrent(engine, [rng.integers(0, vocab, prompt_tokens).tolist() for _ in range(c)], output_tokens)
            for c in concurrency
        ]
    finally:
        engine.close()
    return {
        "model": model_name,
        "arch": model.spec.arch,
        "target": target,
        "commit": _commit(),
        "machine": f"{platform.machine()}, {jax.device_count()} {jax.devices()[0].platform} device(s)",
        "deterministic": deterministic,
        "kv_cache_dtype": kv_cache_dtype,
        "kernel_policy": model.policy.to_dict(),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "load_s": round(load_s, 1),
        "precompile_s": round(compile_s, 1),
        "runs": runs,
    }


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
    )
    print(json.dumps(result, indent=2))
    return 0
