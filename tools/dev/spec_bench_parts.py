"""The pieces tools/dev/bench_speculative_gpu.py measures with: engines over one loaded model (plain, or
speculating with a replay drafter), greedy runs of one or many requests that return their tokens, and the time
between the engine's device calls by kind (plain decode, verify step of k drafts), and the report's arithmetic
(totals over runs, proposals by length, the modeled drafting cost)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import SpeculativeConfig
from ember.runtime.speculative.model_drafter import ModelDrafter
from ember.tools.dev.spec_replay import ReplayDrafter, ReplayProfile

NEVER = ReplayProfile(0.0, (1.0,), (0.0,), "no drafts (plain decode rows)")


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int
    output_tokens: int
    max_streams: int

    def config(self, speculative: SpeculativeConfig | None) -> EngineConfig:
        """An engine holding max_streams whole sequences; no prefix cache (the same prompts run twice: warm-up
        and timed, and a cached prompt would change what is timed)."""
        context = self.prompt_tokens + self.output_tokens + 16
        return EngineConfig(
            num_blocks=self.max_streams * (-(-context // 16) + 1) + 1,
            max_model_len=context,
            max_num_seqs=self.max_streams,
            max_batched_tokens=512,
            enable_prefix_caching=False,
            speculative=speculative,
        )

    def prompts(self, count: int, vocab: int, seed: int) -> list[list[int]]:
        rng = np.random.default_rng(seed)
        return [rng.integers(0, vocab, self.prompt_tokens).tolist() for _ in range(count)]


def plain_engine(model, tokenizer, workload: Workload) -> Engine:
    return Engine(model, tokenizer, workload.config(None))


def replay_engine(
    model,
    tokenizer,
    workload: Workload,
    method: str,
    *,
    adaptive: bool,
    k: int = 8,
    draft_model=None,
    seed: int = 0,
) -> tuple[Engine, ReplayDrafter]:
    """An engine speculating with a ReplayDrafter (profile NEVER until set). method "ngram": drafting is free in
    the adaptive plan; "draft": the plan charges a draft model's cost and, with draft_model (a loaded Model),
    every proposal really runs that model's ModelDrafter for the drafts it hands over."""
    label = None if method == "ngram" else "synthetic draft model (replayed)"
    spec = SpeculativeConfig(method, num_speculative_tokens=k, draft_model=label, adaptive=adaptive)
    config = workload.config(spec)
    cost = None if draft_model is None else ModelDrafter(draft_model, config, int(model.dims.vocab))
    drafter = ReplayDrafter(NEVER, int(model.dims.vocab), seed=seed, cost_drafter=cost)
    return Engine(model, tokenizer, config, drafter=drafter), drafter


def greedy_run(engine: Engine, prompts: list[list[int]], output_tokens: int, one_step_calls: bool = False) -> dict:
    """All prompts at once, greedy, exactly output_tokens each: their tokens, wall and steady decode figures
    (tokens after each request's first / time from the last first token to the end), and the run's
    speculation counts. one_step_calls: no run-ahead (min_tokens keeps a row from running ahead; with no stop
    ids it suppresses nothing, so the tokens are the same)."""
    params = SamplingParams(
        temperature=0.0, ignore_eos=True, max_tokens=output_tokens, min_tokens=output_tokens if one_step_calls else 0
    )
    clock = CallTimes.of(engine)
    before = engine.speculation_stats()
    clock.calls.clear()
    start = time.perf_counter()
    streams = [engine.submit(p, params) for p in prompts]
    tokens, usages = [], []
    for stream in streams:
        mine = []
        for output in stream:
            if output.error:
                raise RuntimeError(output.error)
            mine += output.token_ids
            if output.usage is not None:
                usages.append(output.usage)
        tokens.append(mine)
    wall = time.perf_counter() - start
    after = engine.speculation_stats()
    # from the device call that brought the last first token (the last call with a prefill chunk) to the last
    # call: at batch 1 the request's own decode; with many streams the steady batched decode, credited with
    # every request's tokens after its first (ember bench's rule: tools/bench_measure.py run_concurrent)
    seconds = clock.decode_seconds()
    decoded = sum(u.completion_tokens - 1 for u in usages)
    drafts = after.num_drafts - before.num_drafts
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    return {
        "tokens": tokens,
        "streams": len(prompts),
        "wall_s": round(wall, 3),
        "decoded_tokens": decoded,
        "decode_s": round(seconds, 4),
        "decode_tok_s": round(decoded / seconds, 2) if seconds > 0 else None,
        "drafts": drafts,  # verify rows: a row that drafted in a step counts once
        "draft_tokens": after.num_draft_tokens - before.num_draft_tokens,
        "accepted_tokens": accepted,
        "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
    }


class CallTimes:
    """When each of the engine's device calls reached the host, with its kind: the most drafts of its verify
    rows (0: plain decode), how many decode steps it ran, whether it held a prefill chunk."""

    _attached: dict[int, CallTimes] = {}  # id(engine) -> its clock (one wrapper per engine)

    @classmethod
    def of(cls, engine: Engine) -> CallTimes:
        clock = cls._attached.get(id(engine))
        if clock is None or clock.engine is not engine:
            clock = cls._attached[id(engine)] = cls(engine)
        return clock

    def __init__(self, engine: Engine):
        self.engine = engine
        self.calls: list[tuple[float, int, int, bool]] = []
        executor = engine.executor
        collect = executor.collect

        def timed(in_flight):
            result = collect(in_flight)
            step = in_flight.step
            drafts = max((v.num_tokens - 1 for v in step.verifies), default=0)
            self.calls.append((time.perf_counter(), drafts, len(result), bool(step.prefills)))
            return result

        executor.collect = timed

    def step_ms(self, drafts: int) -> tuple[float | None, int]:
        """(median ms per decode step of the calls whose rows drafted exactly `drafts` tokens, counting only
        calls that follow a decode call, so no prefill or idle time is inside; how many such steps)."""
        per_step = [
            (now - then) * 1e3 / steps
            for (then, _, _, pre_then), (now, d, steps, pre) in zip(self.calls, self.calls[1:])
            if d == drafts and not pre and not pre_then
        ]
        return (round(statistics.median(per_step), 3) if per_step else None), len(per_step)

    def decode_seconds(self) -> float:
        """From the last call holding a prefill chunk to the last call (0 when none came after it)."""
        last_prefill = max((t for t, _, _, pre in self.calls if pre), default=None)
        return 0.0 if last_prefill is None else max(0.0, self.calls[-1][0] - last_prefill)


def set_max_drafts(engine, k: int) -> None:
    """The most drafts per row: the engine's k (scheduler cap, adaptive plan's range) for this replay."""
    engine.scheduler.num_speculative_tokens = k
    if hasattr(engine.scheduler.draft_source, "max_drafts"):
        engine.scheduler.draft_source.max_drafts = k


def by_length(before: list[int], after: list[int]) -> dict[int, int]:
    """Proposals by their length n, from two drafted_per_position snapshots ([i]: drafts of more than i tokens)."""
    diff = [x - (before[i] if i < len(before) else 0) for i, x in enumerate(after)] + [0]
    return {n: diff[n - 1] - diff[n] for n in range(1, len(diff)) if diff[n - 1] - diff[n]}


def total(runs: list[dict]) -> dict:
    """Several runs' counts summed, their decode tok/s over the summed seconds."""
    seconds = sum(r["decode_s"] for r in runs)
    keys = ("decoded_tokens", "drafts", "draft_tokens", "accepted_tokens", "drafting_s")
    summed = {k: round(sum(r.get(k, 0) for r in runs), 4) for k in keys}
    summed.update(
        decode_s=round(seconds, 4), decode_tok_s=round(summed["decoded_tokens"] / seconds, 2) if seconds else None
    )
    if summed["drafts"]:
        summed["mean_acceptance_length"] = round(1 + summed["accepted_tokens"] / summed["drafts"], 3)
    return summed


def modeled(free: dict, draft_step: dict | None, plain: dict) -> dict | None:
    """Drafting-free decode time plus each proposal's measured draft-model cost (draft-step's proposal_ms)."""
    costs = (draft_step or {}).get("proposal_ms", {})
    proposals: dict[int, int] = {}
    for run in free["per_prompt"]:
        for n, count in run["proposals_by_length"].items():
            proposals[n] = proposals.get(n, 0) + count
    if not proposals or any(n not in costs for n in proposals):
        return None  # a proposal length whose cost was not measured
    extra = sum(count * costs[n] / 1e3 for n, count in proposals.items())
    seconds = free["total"]["decode_s"] + extra
    decoded = free["total"]["decoded_tokens"]
    return {
        "how": "drafting-free decode seconds + sum over proposals of the draft model's measured proposal ms",
        "draft_s": round(extra, 4),
        "decode_tok_s": round(decoded / seconds, 2),
        "speedup": round(decoded / seconds / plain["decode_tok_s"], 3),
    }
