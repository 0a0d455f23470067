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
cut short keeps what it measured.
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

import numpy as np

from .bench import (
    SYNTHETIC_PREFIX,
    SYNTHETIC_SHAPES,
    StepClock,
    _commit,
    _run_concurrent,
    apply_rooflines,
    kv_bytes_read,
    load_bench_model,
    model_facts,
    parse_synthetic,
    single_request,
    weight_bytes_per_step,
)

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
        self.started = time.perf_counter()
        self.result = {
            "suite": "ember bench --suite",
            "commit": commit or _commit(),
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
                self.guarded(f"hf {shape}", self.result["hf"].setdefault(shape, {}), self.run_hf, shape)
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
            self.guarded(f"{name} startup", entry.setdefault("startup", {}), self.run_startup, name)
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
            config = self.single_config()
            for section in single:
                entry[section] = {"engine": dataclasses.asdict(config), "runs": []}

            def batch1(engine, clock):
                warm = self.guarded(f"{name} warm-up (batch-1 engine)", {}, self.warm_single, engine, model)
                for section in single:
                    entry[section]["warmup"] = warm
                    self.guarded(
                        f"{name} {section}", entry[section], getattr(self, f"run_{section}"), engine, model, clock
                    )

            self.with_engine(config, model, tokenizer, [entry[s] for s in single], batch1)
        if wanted & {"concurrency", "ttft"}:
            config = self.batch_config()
            out = entry["concurrency"] = {"engine": dataclasses.asdict(config), "runs": []}

            def batched(engine, clock):
                self.guarded(
                    f"{name} concurrency", out, self.run_concurrency, engine, model, clock, "concurrency" in wanted
                )

            self.with_engine(config, model, tokenizer, [out], batched)
            if "ttft" in wanted:
                entry["ttft"] = self.ttft_from(out)
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

    # ---- engines ---------------------------------------------------------------------------------------

    def single_config(self):
        from ..runtime.engine.engine import EngineConfig

        c = self.config
        longest = max([*c.contexts, *c.prefill_lengths]) + c.context_decode_tokens + 1
        blocks = -(-longest // 16)
        return EngineConfig(
            num_blocks=blocks + 2,
            max_model_len=blocks * 16,
            max_num_seqs=1,
            max_batched_tokens=c.prefill_chunk,
            enable_prefix_caching=False,
            kv_cache_dtype=c.kv_cache_dtype,
        )

    def batch_config(self):
        from ..runtime.engine.engine import EngineConfig

        c = self.config
        top = max([*c.concurrency, c.ttft_concurrency])
        context = c.prompt_tokens + c.output_tokens
        # a step's budget as a server's (the largest prefill chunk): decode rows plus as many prompts as fit
        return EngineConfig(
            num_blocks=top * (-(-context // 16) + 1) + 1,
            max_model_len=context,
            max_num_seqs=top,
            max_batched_tokens=max(c.prefill_chunk, c.prompt_tokens + top),
            enable_prefix_caching=False,
            kv_cache_dtype=c.kv_cache_dtype,
        )

    def warm_single(self, out: dict, engine, model) -> None:
        """Compile only the shapes the batch-1 measurements use (a 32k-context engine has many): one short
        request per distinct prefill chunk bucket."""
        from ..runtime.scheduling.scheduled_step import bucket

        buckets = engine.executor.prefill.buckets
        chunk = min(self.config.prefill_chunk, max(buckets))
        lengths = {}
        for n in {*self.config.contexts, *self.config.prefill_lengths}:
            for piece in [n] if n <= chunk else [chunk] + ([n % chunk] if n % chunk else []):
                lengths.setdefault(bucket(piece, buckets), piece)
        begun = time.perf_counter()
        rng = np.random.default_rng(1)
        for piece in sorted(lengths.values()):  # decoding as many tokens as a measurement: the same executables
            single_request(
                engine, rng.integers(0, int(model.dims.vocab), piece).tolist(), self.config.context_decode_tokens + 1
            )
        out.update(
            chunk_tokens=chunk, prompt_lengths=sorted(lengths.values()), seconds=round(time.perf_counter() - begun, 1)
        )

    # ---- sections ----------------------------------------------------------------------------------------

    def run_context(self, out: dict, engine, model, clock: StepClock) -> None:
        n = out["decode_tokens_per_request"] = self.config.context_decode_tokens
        rng = np.random.default_rng(2)
        weights = weight_bytes_per_step(model)
        for ctx in sorted(self.config.contexts):

            def one(row: dict, ctx: int) -> None:
                clock.reset()
                usage = single_request(engine, rng.integers(0, int(model.dims.vocab), ctx).tolist(), n + 1)
                tokens, seconds, _ = clock.decode_after_prefill()
                rate = tokens / seconds
                row.update(
                    decode_tokens=tokens,
                    decode_tokens_per_s=round(rate, 2),
                    ms_per_token=round(1e3 / rate, 3),
                    ttft_s=round(usage.ttft_s, 3),
                    decode_rows=1,
                    call_ends_ms=clock.decode_call_ends_ms(),
                    first_decode_launch=clock.first_decode_launch_ms(),
                    bytes_per_step=int(weights + kv_bytes_read(model, ctx + n // 2, self.config.kv_cache_dtype)),
                )

            out["runs"].append(row := {"context": ctx})
            self.guarded(f"context {ctx}", row, one, ctx)

    def run_prefill(self, out: dict, engine, model, clock: StepClock) -> None:
        rng = np.random.default_rng(3)
        out["chunk_tokens"] = min(self.config.prefill_chunk, max(engine.executor.prefill.buckets))
        for length in sorted(self.config.prefill_lengths):

            def one(row: dict, length: int) -> None:
                ttfts = [
                    single_request(engine, rng.integers(0, int(model.dims.vocab), length).tolist(), 1).ttft_s
                    for _ in range(self.config.prefill_repeats)
                ]
                row.update(
                    ttft_s=round(min(ttfts), 4),
                    ttft_all_s=[round(t, 4) for t in ttfts],
                    prefill_tokens_per_s=round(length / min(ttfts), 1),
                )

            out["runs"].append(row := {"prompt_tokens": length})
            self.guarded(f"prefill {length}", row, one, length)

    def run_concurrency(self, out: dict, engine, model, clock: StepClock, full: bool) -> None:
        c = self.config
        out.update(prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens)
        if c.precompile:
            out["precompile_s"] = round(engine.precompile(), 1)
        rng = np.random.default_rng(0)
        vocab = int(model.dims.vocab)
        _run_concurrent(engine, [rng.integers(0, vocab, c.prompt_tokens).tolist()], 2)  # warm-up
        mean_kv = kv_bytes_read(model, c.prompt_tokens + c.output_tokens // 2, c.kv_cache_dtype)
        for conc in c.concurrency if full else (c.ttft_concurrency,):

            def one(row: dict, conc: int) -> None:
                if not c.precompile:  # the same workload once, untimed: it compiles every shape the timed run uses
                    started = time.perf_counter()  # (a shorter warm-up missed some: H200 run of 8a19fb1)
                    _run_concurrent(
                        engine, [rng.integers(0, vocab, c.prompt_tokens).tolist() for _ in range(conc)], c.output_tokens
                    )
                    row["warmup_s"] = round(time.perf_counter() - started, 1)
                clock.reset()
                row.update(
                    _run_concurrent(
                        engine, [rng.integers(0, vocab, c.prompt_tokens).tolist() for _ in range(conc)], c.output_tokens
                    )
                )
                tokens, seconds, steps = clock.decode_after_prefill()
                row["decode_tokens_per_s_stream"] = row.pop("decode_tokens_per_s")  # bench.py's definition
                rate = tokens / seconds if seconds > 0 else None
                # requests admitted one prefill chunk per step finish one step apart: the window's batch shrinks
                row.update(
                    decode_tokens_per_s=round(rate, 2) if rate else None,
                    steady_decode_tokens=tokens,
                    steady_decode_steps=steps,
                    mean_decode_rows=round(tokens / steps, 1) if steps else None,
                    bytes_per_step=int(weight_bytes_per_step(model, conc) + conc * mean_kv),
                    decode_rows=conc,
                )

            out["runs"].append(row := {"concurrency": conc})
            self.guarded(f"concurrency {conc}", row, one, conc)

    def ttft_from(self, concurrency: dict) -> dict:
        for run in concurrency.get("runs", []):
            if run.get("concurrency") == self.config.ttft_concurrency and "error" not in run:
                return {key: run[key] for key in ("concurrency", "ttft_p50_s", "ttft_p99_s")}
        return {"error": concurrency.get("error", f"no run at {self.config.ttft_concurrency} concurrent")}

    def run_startup(self, out: dict, name: str) -> None:
        from .bench_processes import measure_startup

        # the engine as `ember serve` builds it: keeping its step executables (runtime/execution/executable_cache.py)
        engine = dict(dataclasses.asdict(self.batch_config()), keep_executables=True)
        out.update(
            measure_startup(
                name, self.target, self.tokenizer_dir, engine, self.remaining_timeout, self.config.kernel_policy
            )
        )

    def run_hf(self, out: dict, shape: str) -> None:
        from .bench_processes import measure_hf

        c = self.config
        out.update(
            shape=shape,
            **measure_hf(
                SYNTHETIC_SHAPES[shape][1],
                batches=c.hf_batches,
                prompt_tokens=c.prompt_tokens,
                new_tokens=c.output_tokens,
                device=c.hf_device,
                compile_mode=c.hf_compile,
                python=c.hf_python,
                timeout=self.remaining_timeout(),
            ),
        )

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
