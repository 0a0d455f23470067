"""`ember bench --suite`: the benchmark suite, one process per run, JSON + markdown + PNG in one folder.

Per model (random weights at real shapes, `synthetic:<shape>[-<format>]`, or any model name):
- context: batch-1 decode tok/s after a prompt of each context length (one request, greedy, ignore_eos),
  from the engine's own device-call completion times (StepClock): decode tokens ÷ time from the last
  prefill step to the last decode step. One engine, max_model_len = the longest context; only the shapes
  these requests use are compiled (a warm-up request per prefill chunk bucket).
- prefill: prompt tokens ÷ TTFT of one request with max_tokens=1 (same engine; chunks of `prefill_chunk`).
- concurrency: aggregate decode tok/s with c requests at once (256 → 256 tokens, ignore_eos): tokens of the
  decode-only steps after the last prefill step ÷ their time; also bench.py's stream-based figures
  (output tok/s, TTFT p50/p99). A second engine sized for the largest c; every step shape precompiled.
- ttft: TTFT p50/p99 at 32 concurrent (the concurrency run's, when it ran 32).
- startup: cold compile (a fresh process, empty JAX and Triton caches: load + precompile every step shape of
  the concurrency engine, keeping its executables as `ember serve` does) and warm start (another fresh
  process, the caches filled: launch to ready). Runs first, and its compiled plans are copied into this
  process's cache, so the concurrency engine loads them.
- hf: HF transformers on the same shape (bf16, static cache + torch.compile; tools/bench_hf.py in a
  subprocess, which needs torch), batch 1 and 32; ratios ember/HF (same workload) in the report.
Every decode figure (HF's too) also gets its bandwidth roofline: rate ÷ (rows × bandwidth ÷ bytes read per
step), bytes per step = weight bytes on the device (quantized at their packed size; an embedding table only
gathered from excluded) + each row's KV at its (mean) context, layers × ctx × hkv × dh × 2 × itemsize.
Bandwidth is measured in the same process (an on-device copy and a read, tools/hbm_probe.py; the highest
figure of either), at the start and the end. Every section is guarded: an error or an out-of-memory is
recorded as {"error": ...} and the suite goes on; bench.json is rewritten after every measurement, so a run
cut short keeps what it measured. The measurements themselves, and the engines they run on, are
tools/bench_sections.py's; the report (bench.md, the PNG) tools/bench_report.py's.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .bench_measure import StepClock, apply_rooflines, git_commit, model_facts
from .bench_models import SYNTHETIC_PREFIX, load_bench_model, parse_synthetic
from .bench_sections import SuiteSections

DEFAULT_MODELS = (
    "synthetic:qwen2.5-1.5b-q4_k_m",
    "synthetic:llama3-8b",
    "synthetic:llama3-8b-q4_k_m",
    "synthetic:llama3-8b-fp8",
)
SECTIONS = ("context", "prefill", "concurrency", "ttft", "startup", "hf")


@dataclass(frozen=True)
class SuiteConfig:
    contexts: tuple[int, ...] = (128, 4096, 16384, 32768)
    context_decode_tokens: int = 32  # decode steps timed after each context's prompt
    prefill_lengths: tuple[int, ...] = (512, 4096, 16384)
    prefill_chunk: int = 4096  # max_batched_tokens of the batch-1 engine (the h200 plans' largest prefill bucket)
    prefill_repeats: int = 2  # best TTFT of this many
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    prompt_tokens: int = 256
    output_tokens: int = 256
    ttft_concurrency: int = 32
    bandwidth_gib: float = 4.0
    hf_batches: tuple[int, ...] = (1, 32)
    hf_compile: str = "auto"  # tools/bench_hf.py --compile
    hf_device: str = "cuda"
    hf_python: str = field(default_factory=lambda: sys.executable)
    child_timeout_s: float = 540.0
    deadline_s: float = 0.0  # > 0: start no section after this many seconds (a device call has a hard limit)
    # False: compile only the step shapes each concurrency uses, by an untimed warm-up run at that concurrency,
    # instead of every shape up front (a device call is short, and the cache does not outlive the machine)
    precompile: bool = True
    kv_cache_dtype: str = "auto"  # EngineConfig.kv_cache_dtype of every engine (its bytes enter the rooflines)
    kernel_policy: str | None = None  # a JSON file of overrides over the target's kernel policy


class Suite:
    def __init__(
        self,
        models,
        *,
        target: str,
        sections,
        out_dir,
        tokenizer_dir: str | None,
        commit: str | None,
        config: SuiteConfig,
        hf: bool = True,
    ):
        unknown = set(sections) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)} (known: {', '.join(SECTIONS)})")
        for name in models:  # a misspelt model fails here, before any device time is spent
            if name.startswith(SYNTHETIC_PREFIX):
                parse_synthetic(name)
        self.models, self.target, self.config = list(models), target, config
        self.sections = [s for s in SECTIONS if s in sections and (hf or s != "hf")]
        self.out_dir, self.tokenizer_dir = Path(out_dir), tokenizer_dir
        self.measures = SuiteSections(
            config,
            target=target,
            tokenizer_dir=tokenizer_dir,
            guarded=self.guarded,
            remaining_timeout=self.remaining_timeout,
        )
        self.started = time.perf_counter()
        self.result = {
            "suite": "ember bench --suite",
            "commit": commit or git_commit(),
            "target": target,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "sections": self.sections,
            "config": dataclasses.asdict(config),
            "bandwidth": {},
            "models": {},
            "hf": {},
        }

    # ---- bookkeeping ---------------------------------------------------------------------------------

    def log(self, message: str) -> None:
        print(f"[bench {time.perf_counter() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True)

    def save(self) -> None:
        from .bench_report import attach_hf_ratios

        self.result["wall_s"] = round(time.perf_counter() - self.started, 1)
        apply_rooflines(self.result, self.bandwidth_gb_s)
        attach_hf_ratios(self.result)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "bench.json").write_text(json.dumps(self.result, indent=1, default=str))

    def guarded(self, name: str, out: dict, fn, *args) -> dict:
        """fn(out, *args) fills `out` (already in the result, so a save mid-way keeps what it measured); an
        exception (an OOM, a failed compile) is recorded in it and ends this part only."""
        if self.past_deadline():
            out["error"] = f"skipped: past the suite's deadline ({self.config.deadline_s:.0f} s)"
            return out
        begun = time.perf_counter()
        try:
            fn(out, *args)
        except Exception as error:
            out["error"] = f"{type(error).__name__}: {str(error)[:2000]}"
        out["section_s"] = round(time.perf_counter() - begun, 1)
        self.log(f"{name}: {'error: ' + out['error'][:200] if 'error' in out else 'done'} in {out['section_s']} s")
        self.save()
        return out

    def past_deadline(self) -> bool:
        return bool(self.config.deadline_s) and time.perf_counter() - self.started > self.config.deadline_s

    @property
    def bandwidth_gb_s(self) -> float | None:
        values = [v for key in ("copy_gb_s", "read_gb_s") for v in self.result["bandwidth"].get(key) or []]
        return max(values) if values else None  # the best this device showed: the strictest roofline

    def measure_bandwidth(self) -> None:
        """Both HBM probes once more, appended to the run's lists."""
        from . import hbm_probe

        for key, value in hbm_probe.measure(self.config.bandwidth_gib).items():
            self.result["bandwidth"][key].append(value)

    # ---- the run -------------------------------------------------------------------------------------

    def run(self) -> dict:
        import jax

        from . import hbm_probe

        device = jax.devices()[0]
        self.result["machine"] = {
            "device": getattr(device, "device_kind", str(device)),
            "platform": device.platform,
            "devices": jax.device_count(),
            "jax": jax.__version__,
        }
        self.result["bandwidth"] = {
            "copy_gb_s": [],
            "read_gb_s": [],
            "method": hbm_probe.METHOD.format(gib=self.config.bandwidth_gib),
        }
        self.measure_bandwidth()
        self.log(f"HBM bandwidth {self.result['bandwidth']} GB/s")
        self.save()
        if "hf" in self.sections:
            for shape in dict.fromkeys(s for s in map(_hf_shape, self.models) if s):
                self.guarded(f"hf {shape}", self.result["hf"].setdefault(shape, {}), self.measures.run_hf, shape)
        for name in self.models:
            self.result["models"][name] = entry = {}
            self.run_model(name, entry)
            gc.collect()
        try:  # again at the end: how steady the device was over the run
            self.measure_bandwidth()
        except Exception as error:
            self.result["bandwidth"]["end_error"] = f"{type(error).__name__}: {str(error)[:500]}"
        self.save()
        self.write_report()
        return self.result

    def write_report(self) -> None:
        from .bench_report import write_report

        try:
            written = write_report(self.result, self.out_dir)
            self.log("wrote " + ", ".join(str(p) for p in [self.out_dir / "bench.json", *written]))
        except Exception as error:  # the JSON is the record; a report bug must not lose it
            self.result["report_error"] = f"{type(error).__name__}: {error}"
            self.save()

    def run_model(self, name: str, entry: dict) -> None:
        wanted = set(self.sections)
        if "startup" in wanted:  # first: its cold process must find no compiled plan of ours in any cache
            self.guarded(f"{name} startup", entry.setdefault("startup", {}), self.measures.run_startup, name)
        if not wanted & {"context", "prefill", "concurrency", "ttft"}:
            return
        if self.past_deadline():
            entry["error"] = f"skipped: past the suite's deadline ({self.config.deadline_s:.0f} s)"
            return
        begun = time.perf_counter()
        try:
            model, tokenizer = load_bench_model(name, self.target, self.tokenizer_dir, self.config.kernel_policy)
        except Exception as error:
            entry["error"] = f"load: {type(error).__name__}: {str(error)[:2000]}"
            self.save()
            return
        entry.update(
            status="measured",
            load_s=round(time.perf_counter() - begun, 1),
            **model_facts(model, self.config.kv_cache_dtype),
        )
        self.log(f"{name}: loaded in {entry['load_s']} s, {entry['weight_bytes_per_step'] / 1e9:.2f} GB read per step")
        single = [s for s in ("context", "prefill") if s in wanted]
        if single:
            config = self.measures.single_config()
            for section in single:
                entry[section] = {"engine": dataclasses.asdict(config), "runs": []}

            def batch1(engine, clock):
                warm = self.guarded(f"{name} warm-up (batch-1 engine)", {}, self.measures.warm_single, engine, model)
                for section in single:
                    entry[section]["warmup"] = warm
                    self.guarded(
                        f"{name} {section}",
                        entry[section],
                        getattr(self.measures, f"run_{section}"),
                        engine,
                        model,
                        clock,
                    )

            self.with_engine(config, model, tokenizer, [entry[s] for s in single], batch1)
        if wanted & {"concurrency", "ttft"}:
            config = self.measures.batch_config()
            out = entry["concurrency"] = {"engine": dataclasses.asdict(config), "runs": []}

            def batched(engine, clock):
                self.guarded(
                    f"{name} concurrency",
                    out,
                    self.measures.run_concurrency,
                    engine,
                    model,
                    clock,
                    "concurrency" in wanted,
                )

            self.with_engine(config, model, tokenizer, [out], batched)
            if "ttft" in wanted:
                entry["ttft"] = self.measures.ttft_from(out)
                self.save()

    def with_engine(self, config, model, tokenizer, outs: list[dict], body) -> None:
        """body(engine, clock) with an engine of `config`, closed after and its KV pool freed at once (the
        step clock and the executor reference each other). An engine that cannot be built (its KV pool does
        not fit, say) marks each section it was for with the error."""
        from ..runtime.engine.engine import Engine

        try:
            engine = Engine(model, tokenizer, config)
        except Exception as error:
            for out in outs:
                out["error"] = f"engine: {type(error).__name__}: {str(error)[:2000]}"
            self.save()
            return
        try:
            body(engine, StepClock(engine))
        finally:
            engine.close()
            del engine
            gc.collect()

    def remaining_timeout(self) -> float:
        if not self.config.deadline_s:
            return self.config.child_timeout_s
        left = self.config.deadline_s - (time.perf_counter() - self.started) + 60  # a started section may finish
        return max(30.0, min(self.config.child_timeout_s, left))


def _hf_shape(model_name: str) -> str | None:
    """The synthetic shape HF transformers runs for a model (bf16 whatever the model's format), if any."""
    if not model_name.startswith(SYNTHETIC_PREFIX):
        return None
    return parse_synthetic(model_name)[0]


def run_suite(
    models,
    *,
    target: str,
    sections=SECTIONS,
    out_dir,
    hf: bool = True,
    tokenizer_dir: str | None = None,
    commit: str | None = None,
    config: SuiteConfig = SuiteConfig(),
) -> dict:
    # XLA's default takes 75% of the GPU at start; the suite's own subprocesses (startup, HF) need room beside it
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    suite = Suite(
        models,
        target=target,
        sections=sections,
        out_dir=out_dir,
        tokenizer_dir=tokenizer_dir,
        commit=commit,
        config=config,
        hf=hf,
    )
    return suite.run()


def main_suite(args) -> int:
    """`ember bench --suite ...` (tools/cli.py parses the flags)."""
    overrides = {
        k: (tuple(v) if isinstance(v, list) else v)
        for k, v in {
            "contexts": args.contexts,
            "context_decode_tokens": args.context_decode_tokens,
            "prefill_lengths": args.prefill_lengths,
            "prefill_chunk": args.prefill_chunk,
            "concurrency": args.concurrency,
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "ttft_concurrency": args.ttft_concurrency,
            "bandwidth_gib": args.bandwidth_gib,
            "hf_batches": args.hf_batches,
            "hf_compile": args.hf_compile,
            "hf_device": args.hf_device,
            "hf_python": args.hf_python,
            "deadline_s": args.deadline_s,
            "precompile": False if args.lazy_compile else None,
            "kv_cache_dtype": args.kv_cache_dtype,
            "kernel_policy": args.kernel_policy,
        }.items()
        if v is not None
    }
    result = run_suite(
        args.models or DEFAULT_MODELS,
        target=args.target,
        sections=args.sections or SECTIONS,
        out_dir=args.out,
        hf=not args.no_hf,
        tokenizer_dir=args.tokenizer,
        commit=args.commit,
        config=SuiteConfig(**overrides),
    )
    print(json.dumps({"out": str(args.out), "models": list(result["models"]), "wall_s": result["wall_s"]}))
    return 0
