"""The benchmark suite's measurements (tools/bench_suite.py, `ember bench --suite`): the engines they run on,
the batch-1 warm-up, and one method per section (context, prefill, concurrency, ttft, startup, hf), each
filling the `out` dict the suite's `guarded` hands it. What each section measures is tools/bench_suite.py's docstring.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .bench_measure import StepClock, run_concurrent, single_request
from .bench_models import SYNTHETIC_SHAPES, kv_bytes_read, weight_bytes_per_step


class SuiteSections:
    """The suite's section methods. Suite owns one and hands it what the sections need of it: the config,
    the target, the tokenizer folder, `guarded` (runs one part, recording its error and saving the result)
    and `remaining_timeout` (seconds left before the suite's deadline)."""

    def __init__(self, config, *, target: str, tokenizer_dir: str | None, guarded, remaining_timeout) -> None:
        self.config, self.target, self.tokenizer_dir = config, target, tokenizer_dir
        self.guarded, self.remaining_timeout = guarded, remaining_timeout

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
        run_concurrent(engine, [rng.integers(0, vocab, c.prompt_tokens).tolist()], 2)  # warm-up
        mean_kv = kv_bytes_read(model, c.prompt_tokens + c.output_tokens // 2, c.kv_cache_dtype)
        for conc in c.concurrency if full else (c.ttft_concurrency,):

            def one(row: dict, conc: int) -> None:
                if not c.precompile:  # the same workload once, untimed: it compiles every shape the timed run uses
                    started = time.perf_counter()  # (a shorter warm-up missed some: H200 run of 8a19fb1)
                    run_concurrent(
                        engine, [rng.integers(0, vocab, c.prompt_tokens).tolist() for _ in range(conc)], c.output_tokens
                    )
                    row["warmup_s"] = round(time.perf_counter() - started, 1)
                clock.reset()
                row.update(
                    run_concurrent(
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
