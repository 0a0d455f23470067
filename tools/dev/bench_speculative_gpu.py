"""Speculative decoding's GPU measurements (issue 32, "Measured", H200 half) on synthetic models, with the
acceptance recorded on the CPU with real weights replayed (tools/dev/spec_replay.py). JSON to --out, rewritten
after every measurement (a run cut short keeps what it measured). Sections, each bounded by its share of
--budget-s (what it had no time for is listed under "skipped"):

- draft-step: the synthetic draft model's (0.5B, the real file's quantization layout) batch-1 decode step in a
  plain engine, and its ModelDrafter's proposal of k drafts (catch-up chunk + k - 1 decodes) in ms.
- e2e: batch-1 greedy decode tok/s of the target, plain vs speculative, replaying the recorded drafters
  (WORKLOAD/DRAFTER/K, e.g. code_editing/ngram/4). Drafter "draft": every proposal really runs the synthetic
  draft model for its drafts (tokens thrown away: the replay's are verified); also run with drafting free
  and the modeled figure (free decode time + each proposal's measured draft-step cost) beside it.
- verify: per model, the verify step's ms at k drafts (every draft wrong: one token per step) against the plain
  decode step of the same engine and prompt (in the engine's run-ahead calls, and in one-step calls): ms per
  step and the ratios.
- aggregate: decode tok/s at many streams, plain vs speculative (code-editing rates, the adaptive plan on):
  whether the plan avoids a loss (issue target >= 0.97x).

Every speculative output is compared with the plain output of the same prompt (greedy: it must be identical);
the exit status is 1 when one differs. Engines compile lazily: each timed run follows an identical untimed one.

    python -m ember.tools.dev.bench_speculative_gpu --target h200 --tokenizer .gpu/tok --commit SHA --out r.json
    python -m ember.tools.dev.bench_speculative_gpu --smoke --tokenizer DIR --out /tmp/smoke.json   (CPU)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from ember.runtime.speculative.drafter import DraftContext
from ember.runtime.speculative.model_drafter import ModelDrafter
from ember.tools.bench_models import load_bench_model
from ember.tools.dev.spec_bench_parts import (
    CallTimes,
    Workload,
    by_length,
    greedy_run,
    modeled,
    plain_engine,
    replay_engine,
    set_max_drafts,
    total,
)
from ember.tools.dev.spec_replay import ReplayProfile, load_profiles

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "docs/results/cpu_spec_acceptance_ea66b8f.json"
SECTIONS = ("draft-step", "e2e", "verify", "aggregate")
SHARES = {"draft-step": 0.1, "e2e": 0.35, "verify": 0.3, "aggregate": 0.25}  # of the time left when each starts
E2E = (
    "code_editing/ngram/4",
    "code_editing/ngram/8",
    "code_editing/draft/4",
    "code_editing/draft/8",
    "free_form/draft/4",
)
SMOKE = {
    "target": "cpu",
    "target_model": "synthetic:qwen2-tiny",
    "draft_model": "synthetic:qwen2-tiny",
    "verify_models": ["synthetic:qwen2-tiny"],
    "verify_k": [1, 2],
    "draft_k": [2],
    "prompt_tokens": 16,
    "output_tokens": 12,
    "verify_output_tokens": 10,
    "e2e_prompts": 1,
    "e2e": ["code_editing/draft/4"],
    "streams": [2],
    "aggregate_drafters": ["draft"],
    "budget_s": 300.0,
}


class Bench:
    def __init__(self, args):
        self.args = args
        self.profiles = load_profiles(args.profiles)
        self.models: dict[str, tuple] = {}
        self.end = time.perf_counter() + args.budget_s
        self.deadline = self.end
        self.result = {
            "what": "speculative decoding on synthetic models with CPU-recorded acceptance replayed (issue 32)",
            "commit": args.commit,
            "target": args.target,
            "machine": None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "profiles_file": str(args.profiles),
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "profiles")},
            "sections": {},
            "skipped": [],
            "mismatches": [],
        }

    # --- bookkeeping ------------------------------------------------------------------------------------
    def model(self, name: str):
        if name not in self.models:
            begun = time.perf_counter()
            self.models[name] = load_bench_model(name, self.args.target, self.args.tokenizer, self.args.kernel_policy)
            self.result.setdefault("load_s", {})[name] = round(time.perf_counter() - begun, 1)
        return self.models[name]

    def time_left(self, what: str) -> bool:
        if time.perf_counter() < self.deadline:
            return True
        self.result["skipped"].append(what)
        self.save()
        return False

    def check(self, what: str, plain: list[list[int]], spec: list[list[int]]) -> bool:
        same = plain == spec
        if not same:  # where: a numerical near-tie flipped (bf16) or a real bug; the replay stops drafting there
            first = [
                next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                for a, b in zip(plain, spec)
                if a != b
            ]
            self.result["mismatches"].append({"run": what, "first_different_token": first})
        return same

    def save(self) -> None:
        self.result["greedy_identical"] = not self.result["mismatches"]
        Path(self.args.out).write_text(json.dumps(self.result, indent=1) + "\n")

    def profile(self, workload: str, drafter: str, k: int) -> ReplayProfile:
        return self.profiles[(workload, drafter, k)]

    # --- (b) the draft model's own step -------------------------------------------------------------------
    def draft_step(self) -> dict:
        a = self.args
        model, tokenizer = self.model(a.draft_model)
        work = Workload(a.prompt_tokens, a.output_tokens, 1)
        out = {"model": a.draft_model, "proposal_ms": {}}
        engine = plain_engine(model, tokenizer, work)
        try:
            clock = CallTimes.of(engine)
            prompt = work.prompts(1, int(model.dims.vocab), 7)
            greedy_run(engine, prompt, a.output_tokens)  # compiles
            run = greedy_run(engine, prompt, a.output_tokens)
            ms, steps = clock.step_ms(0)
            out.update(plain_decode_step_ms=ms, steps=steps, decode_tok_s=run["decode_tok_s"])
            out["decode_steps_per_call"] = engine.executor.decode_steps
        finally:
            engine.close()
        drafter = ModelDrafter(model, work.config(None), int(model.dims.vocab))
        for k in a.draft_k:
            if not self.time_left(f"draft-step proposal k={k}"):
                break
            # a request whose context grows by 2 tokens per proposal (one draft accepted + the bonus token)
            prompt, output, times = work.prompts(1, int(model.dims.vocab), 8)[0], [], []
            for i in range(a.proposals + 1):
                begun = time.perf_counter()
                drafter.propose(DraftContext(f"k{k}", prompt, tuple(output)), k)
                times.append((time.perf_counter() - begun) * 1e3)
                output += [1 + i % 7, 2 + i % 5]
            drafter.release(f"k{k}")
            times = sorted(times[1:])  # the first compiles
            out["proposal_ms"][k] = round(times[len(times) // 2], 3)
            self.save()
        return out

    # --- (c) batch-1 end to end -----------------------------------------------------------------------------
    def e2e(self) -> dict:
        a = self.args
        model, tokenizer = self.model(a.target_model)
        vocab = int(model.dims.vocab)
        work = Workload(a.prompt_tokens, a.output_tokens, max(a.streams))
        prompts = work.prompts(a.e2e_prompts, vocab, 11)
        out = {"target_model": a.target_model, "draft_model": a.draft_model, "runs": {}}
        self.result["sections"]["e2e"] = out
        # the speculating engines the e2e and aggregate runs name (their executables compile once, for both)
        wanted = {item.split("/")[1] for item in a.e2e} | set(a.aggregate_drafters)
        self._engines = {"plain": plain_engine(model, tokenizer, work)}
        if "ngram" in wanted:
            self._engines["ngram"] = replay_engine(model, tokenizer, work, "ngram", adaptive=True)
        if "draft" in wanted:
            draft_model, _ = self.model(a.draft_model)
            self._engines["draft"] = replay_engine(
                model, tokenizer, work, "draft", adaptive=True, draft_model=draft_model
            )
        plain = self._engines["plain"]
        greedy_run(plain, prompts[:1], a.output_tokens)  # compiles
        references = [greedy_run(plain, [p], a.output_tokens) for p in prompts]
        for name in wanted:
            for p, ref in zip(prompts, references):
                self._engines[name][1].record(p, ref["tokens"][0])
        out["plain"] = total(references)
        for item in a.e2e:
            workload, drafter, k = item.split("/")
            if not self.time_left(f"e2e {item}"):
                break
            profile = self.profile(workload, drafter, int(k))
            # the engine as served: the adaptive plan on, at most the recording's k drafts per row
            entry = {"profile": profile.to_dict(), "engine_k": profile.k, "adaptive": True}
            entry["draft_cost"] = (
                "charged: the synthetic draft model really drafts (catch-up + k - 1 decodes)"
                if drafter == "draft"
                else "none: lookup drafting is treated as free"
            )
            entry.update(self._e2e_runs(item, drafter, profile, prompts, references))
            if drafter == "draft" and self.time_left(f"e2e {item} drafting free"):
                engine, replay = self._engines["draft"]
                cost, replay.cost_drafter = replay.cost_drafter, None
                try:
                    free = self._e2e_runs(item + " free", drafter, profile, prompts, references)
                finally:
                    replay.cost_drafter = cost
                entry["drafting_free"] = free
                entry["modeled"] = modeled(free, self.result["sections"].get("draft-step"), out["plain"])
            out["runs"][item] = entry
            self.save()
        return out

    def _e2e_runs(self, what: str, drafter: str, profile: ReplayProfile, prompts, references) -> dict:
        engine, replay = self._engines[drafter]
        set_max_drafts(engine, profile.k)
        runs = []
        for i, (p, ref) in enumerate(zip(prompts, references)):
            for _ in range(2):  # the first compiles what the second runs (same seed: the same drafts)
                before, off, drafting = replay.intended.drafted_per_position[:], replay.off_reference, replay.drafting_s
                replay.reset(profile, seed=100 + i)
                run = greedy_run(engine, [p], self.args.output_tokens)
            run["off_reference"] = replay.off_reference - off  # proposals after the output left the plain one
            run["drafting_s"] = round(replay.drafting_s - drafting, 4)  # inside the draft model (0: drafting free)
            run["identical"] = self.check(f"e2e {what} prompt {i}", ref["tokens"], run.pop("tokens"))
            run["proposals_by_length"] = by_length(before, replay.intended.drafted_per_position)
            runs.append(run)
        summed, plain = total(runs), total(references)
        summed["speedup"] = round(summed["decode_tok_s"] / plain["decode_tok_s"], 3)
        return {"per_prompt": runs, "total": summed}

    # --- (a) verify step cost -------------------------------------------------------------------------------
    def verify(self) -> dict:
        a = self.args
        out = self.result["sections"].setdefault("verify", {})
        for name in a.verify_models:
            if not self.time_left(f"verify {name}"):
                break
            model, tokenizer = self.model(name)
            # the e2e engines' sizes: the same step shapes, so the target model's verify executables come from the
            # persistent compilation cache where the machine keeps one (JAX_COMPILATION_CACHE_DIR)
            work = Workload(a.prompt_tokens, a.output_tokens, max(a.streams))
            engine, replay = replay_engine(model, tokenizer, work, "ngram", adaptive=False, k=max(a.verify_k))
            entry = out[name] = {"k": {}}
            try:
                clock = CallTimes.of(engine)
                prompt = work.prompts(1, int(model.dims.vocab), 5)
                # plain decoding as it runs without speculation (run-ahead calls where the target has them): a
                # source that may draft keeps every decode call to one step (runtime/scheduling/speculation.py)
                source, engine.scheduler.draft_source = engine.scheduler.draft_source, None
                try:
                    greedy_run(engine, prompt, a.verify_output_tokens)
                    reference = greedy_run(engine, prompt, a.verify_output_tokens)["tokens"]
                finally:
                    engine.scheduler.draft_source = source
                replay.record(prompt[0], reference[0])
                plain_ms, steps = clock.step_ms(0)
                entry.update(plain_step_ms=plain_ms, plain_steps=steps)
                entry["decode_steps_per_call"] = engine.executor.decode_steps
                # the decode forward alone: one step per call, as a verify step is
                for _ in range(2):
                    run = greedy_run(engine, prompt, a.verify_output_tokens, one_step_calls=True)
                single_ms, _ = clock.step_ms(0)
                entry["plain_one_step_call_ms"] = single_ms
                entry["one_step_identical"] = self.check(f"verify {name} one-step calls", reference, run["tokens"])
                for k in a.verify_k:
                    if not self.time_left(f"verify {name} k={k}"):
                        break
                    for _ in range(2):
                        replay.reset(ReplayProfile.fixed(k), seed=k)
                        run = greedy_run(engine, prompt, a.verify_output_tokens)
                    ms, steps = clock.step_ms(k)
                    entry["k"][k] = {
                        "verify_step_ms": ms,
                        "steps": steps,
                        "ratio_to_plain_step": round(ms / plain_ms, 3) if ms and plain_ms else None,
                        "ratio_to_one_step_call": round(ms / single_ms, 3) if ms and single_ms else None,
                        # the adaptive plan's verify_token_cost (runtime/speculative/config.py) as this k implies it
                        "cost_per_draft_in_plain_steps": round((ms / plain_ms - 1) / k, 4) if ms and plain_ms else None,
                        "identical": self.check(f"verify {name} k={k}", reference, run["tokens"]),
                    }
                    self.save()
            finally:
                engine.close()
        return out

    # --- (d) many streams -------------------------------------------------------------------------------------
    def aggregate(self) -> dict:
        a = self.args
        model, _ = self.model(a.target_model)
        if not hasattr(self, "_engines"):
            raise RuntimeError("the aggregate section runs after e2e (it reuses its engines)")
        out = self.result["sections"].setdefault("aggregate", {"runs": {}})
        plain = self._engines["plain"]
        for streams in a.streams:
            if not self.time_left(f"aggregate {streams} streams"):
                break
            prompts = Workload(a.prompt_tokens, a.output_tokens, streams).prompts(
                streams, int(model.dims.vocab), streams
            )
            greedy_run(plain, prompts, a.output_tokens)
            ref = greedy_run(plain, prompts, a.output_tokens)
            entry = out["runs"][streams] = {"plain": {k: v for k, v in ref.items() if k != "tokens"}}
            for drafter in a.aggregate_drafters:
                if not self.time_left(f"aggregate {streams} streams {drafter}"):
                    break
                engine, replay = self._engines[drafter]
                profile = self.profile("code_editing", drafter, 8)
                set_max_drafts(engine, profile.k)
                for p, tokens in zip(prompts, ref["tokens"]):
                    replay.record(p, tokens)
                for _ in range(2):
                    replay.reset(profile, seed=streams)
                    run = greedy_run(engine, prompts, a.output_tokens)
                run["identical"] = self.check(f"aggregate {streams} {drafter}", ref["tokens"], run.pop("tokens"))
                run["ratio"] = round(run["decode_tok_s"] / ref["decode_tok_s"], 3)
                run["profile"], run["adaptive"] = profile.label, True
                entry[drafter] = run
                self.save()
        return out

    def run(self) -> int:
        import jax

        self.result["machine"] = f"{platform.machine()}, {jax.device_count()} {jax.devices()[0].platform} device(s)"
        try:
            for section in [s for s in SECTIONS if s in self.args.sections]:
                left = [s for s in SECTIONS[SECTIONS.index(section) :] if s in self.args.sections]
                now = time.perf_counter()
                self.deadline = now + (self.end - now) * SHARES[section] / sum(SHARES[s] for s in left)
                if self.time_left(section):
                    begun = time.perf_counter()
                    self.result["sections"][section] = getattr(self, section.replace("-", "_"))()
                    self.result.setdefault("section_s", {})[section] = round(time.perf_counter() - begun, 1)
                    self.save()
        finally:
            for engine in getattr(self, "_engines", {}).values():
                (engine[0] if isinstance(engine, tuple) else engine).close()
            self.save()
        return 0 if not self.result["mismatches"] else 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, small sizes (CI)")
    p.add_argument("--target", default="h200")
    p.add_argument("--tokenizer", required=True, help="HF tokenizer folder for the synthetic models")
    p.add_argument("--kernel-policy", help="JSON kernel policy overrides (ember bench's)")
    p.add_argument("--commit", default="unknown")
    p.add_argument("--out", required=True)
    p.add_argument("--profiles", default=str(PROFILES), help="CPU acceptance JSON (tools/dev/spec_acceptance.py)")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--target-model", default="synthetic:qwen2.5-1.5b-q4_k_m")
    p.add_argument("--draft-model", default="synthetic:qwen2.5-0.5b-q4_k_m")
    p.add_argument("--verify-models", nargs="+", default=["synthetic:qwen2.5-1.5b-q4_k_m", "synthetic:llama3-8b"])
    p.add_argument("--verify-k", type=int, nargs="+", default=[1, 2, 4, 8, 3, 5, 6, 7])
    p.add_argument("--draft-k", type=int, nargs="+", default=[4, 8, 1, 2, 3, 5, 6, 7])
    p.add_argument("--proposals", type=int, default=8, help="timed proposals per k (draft-step)")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--verify-output-tokens", type=int, default=64)
    p.add_argument("--e2e-prompts", type=int, default=3)
    p.add_argument("--e2e", nargs="+", default=list(E2E), help="WORKLOAD/DRAFTER/K replays (drafter ngram or draft)")
    p.add_argument("--streams", type=int, nargs="+", default=[32, 128, 8])
    p.add_argument("--aggregate-drafters", nargs="+", choices=("ngram", "draft"), default=["ngram", "draft"])
    p.add_argument("--budget-s", type=float, default=400.0, help="all sections together (compile included)")
    args = p.parse_args(argv)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    if "aggregate" in args.sections and "e2e" not in args.sections:
        p.error("aggregate reuses the e2e section's engines: name e2e too")
    return args


def main(argv=None) -> int:
    return Bench(parse_args(argv)).run()


if __name__ == "__main__":
    raise SystemExit(main())
