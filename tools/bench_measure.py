"""Measuring helpers that `ember bench` (tools/bench.py) and the benchmark suite (tools/bench_suite.py) share:
the commit measured, c requests at once through the engine, one request to its end, the engine's device-call
clock, a loaded model's facts for the report, and the bandwidth rooflines of the suite's decode figures.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np

from .bench_models import weight_bytes_per_step


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_concurrent(engine, prompts: list[list[int]], output_tokens: int) -> dict:
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
