"""Per-position acceptance of a drafter against the real target's greedy output, measured offline (CPU).

For each prompt of a workload (tools/dev/spec_workloads/*.json) the target model decodes greedily (no
speculation: the reference output T), then the speculative loop is replayed over T: at output position j the
drafter proposes up to k tokens from prompt + T[:j], the longest prefix equal to T[j:] is accepted, and the
replay moves to j + accepted + 1 (the accepted drafts, then the target's own token). For greedy decoding this
is exactly what speculative decoding with the engine would do, so the counts are its acceptance; they are
what the H200 replay drafter plays back (issue 32, "Measured").

Drafters: `ngram` (ember.runtime.speculative.ngram, no weights), `draft` (a second model decoding greedily
as a plain second model, here through SequenceRunner with its KV cut back to the common prefix after every
step: valid for attention-only models, whose cache past `length` is never read) and `mtp` (the target's own
MTP module, ember.runtime.speculative.mtp_drafter, fed by an incremental hidden-state pass of the target; for
checkpoints that carry one: `--model PATH` of a Qwen3-Next / Qwen3.5 checkpoint).

Target outputs are cached (--outputs-cache, JSON of token ids per prompt), so several drafter settings replay
one target run. Drafts are capped so they never run past the end of T (the last steps draft fewer tokens).

    .venv/bin/python tools/dev/spec_acceptance.py --workload code_editing --limit 4 --max-tokens 96 \
        --outputs-cache /tmp/spec_outputs.json --out docs/results/cpu_spec_acceptance_ngram_<commit>.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.checkpoint import open_checkpoint
from ember.runtime.loading.known_models import DEFAULT_MODEL, resolve_model
from ember.runtime.loading.model import Model, load_model
from ember.runtime.loading.text.prompting import end_of_generation_ids, load_tokenizer, render_chat
from ember.runtime.speculative.drafter import Draft, DraftContext, Drafter
from ember.runtime.speculative.mtp_drafter import IncrementalHiddenStates, MtpDrafter
from ember.runtime.speculative.ngram import NgramConfig, NgramDrafter
from ember.runtime.speculative.stats import AcceptanceStats

WORKLOADS = Path(__file__).resolve().parent / "spec_workloads"
DRAFT_MODEL = "qwen2.5-coder-0.5b-instruct"


def load_workload(name: str) -> list[dict]:
    path = Path(name) if Path(name).is_file() else WORKLOADS / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))["prompts"]


def user_message(item: dict) -> str:
    """The chat user message of a workload item: the instruction, then the code fenced (code_editing only)."""
    if "code" not in item:
        return item["instruction"]
    return f"{item['instruction']}\n\n```{item.get('language', '')}\n{item['code']}```"


def greedy_output(model: Model, prompt_ids: list[int], max_tokens: int, eos_ids: frozenset[int]) -> list[int]:
    """The target's plain greedy continuation (stops after an end-of-generation id or max_tokens)."""
    runner = SequenceRunner(model, len(prompt_ids) + max_tokens)
    logits = runner.prefill(prompt_ids)
    output: list[int] = []
    while len(output) < max_tokens:
        output.append(int(np.argmax(logits)))
        if output[-1] in eos_ids or len(output) == max_tokens:
            break
        logits = runner.decode(output[-1])
    return output


class GreedyModelDrafter:
    """A second model's greedy continuation as the draft (no probabilities: greedy drafts are point masses)."""

    def __init__(self, model: Model, capacity: int) -> None:
        self.runner = SequenceRunner(model, capacity)
        self.cached: list[int] = []  # the tokens whose KV the runner holds, in order

    def propose(self, context: DraftContext, k: int) -> Draft:
        tokens = [*context.prompt_ids, *context.output_ids]
        if k <= 0 or not tokens:
            return Draft()
        common = 0
        for a, b in zip(self.cached, tokens):
            if a != b:
                break
            common += 1
        common = min(common, len(tokens) - 1)  # re-feed at least the last token: its logits start the draft
        self.runner.length = common  # attention reads only the first `length` positions: a cut is a rollback
        logits = self.runner.prefill(tokens[common:])
        drafts: list[int] = []
        while True:
            drafts.append(int(np.argmax(logits)))
            if len(drafts) == k:
                break
            logits = self.runner.decode(drafts[-1])
        self.cached = tokens + drafts[:-1]
        return Draft(tuple(drafts))

    def release(self, request_id: str) -> None:
        self.cached = []
        self.runner.length = 0


def mtp_drafter(target: Model, capacity: int) -> MtpDrafter:
    """The target's MTP drafter over an incremental hidden-state pass of the target (greedy drafts)."""
    return MtpDrafter(target, IncrementalHiddenStates(target, max_model_len=capacity), max_model_len=capacity)


def replay(drafter: Drafter, request_id: str, prompt_ids: list[int], output: list[int], k: int) -> AcceptanceStats:
    """The greedy speculative loop over the known output: drafts compared with it, never run past its end."""
    stats = AcceptanceStats()
    position = 0
    while position < len(output):
        room = min(k, len(output) - position - 1)  # the step's last token is the target's own
        draft = drafter.propose(DraftContext(request_id, prompt_ids, output[:position]), room).token_ids[:room]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == output[position + accepted]:
            accepted += 1
        stats.record(len(draft), accepted)
        position += accepted + 1
    drafter.release(request_id)
    return stats


def commit_of_repo() -> str:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="code_editing", help="code_editing, free_form, or a JSON path")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--drafter", choices=("ngram", "draft", "mtp"), default="ngram")
    parser.add_argument("--draft-model", default=DRAFT_MODEL)
    parser.add_argument("--k", type=int, nargs="+", default=[4], help="draft lengths to replay (one result each)")
    parser.add_argument("--min-match", type=int, default=NgramConfig.min_match)
    parser.add_argument("--max-match", type=int, default=NgramConfig.max_match)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--ids", nargs="*", default=None, help="only these prompt ids")
    parser.add_argument("--outputs-cache", type=Path, default=None, help="target outputs: read if present, written")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    items = load_workload(args.workload)
    if args.ids:
        items = [item for item in items if item["id"] in args.ids]
    items = items[: args.limit]
    cache = json.loads(args.outputs_cache.read_text()) if args.outputs_cache and args.outputs_cache.is_file() else {}

    target_path = resolve_model(args.model, progress=False)
    checkpoint = open_checkpoint(target_path)
    tokenizer = load_tokenizer(checkpoint)
    eos = end_of_generation_ids(tokenizer, checkpoint.generation_config)
    target = None  # loaded only when an output is not cached
    prompts, outputs, target_seconds = {}, {}, {}
    for item in items:
        text = render_chat(tokenizer, [{"role": "user", "content": user_message(item)}])
        prompts[item["id"]] = tokenizer.encode(text, add_special_tokens=False)
        key = f"{args.model}|{args.max_tokens}|{item['id']}"
        if key in cache and cache[key]["prompt_ids"] == prompts[item["id"]]:
            outputs[item["id"]] = cache[key]["output_ids"]
            continue
        target = target or load_model(checkpoint, target="cpu")
        started = time.perf_counter()
        outputs[item["id"]] = greedy_output(target, prompts[item["id"]], args.max_tokens, eos)
        target_seconds[item["id"]] = round(time.perf_counter() - started, 1)
        cache[key] = {"prompt_ids": prompts[item["id"]], "output_ids": outputs[item["id"]]}
        print(f"{item['id']}: {len(outputs[item['id']])} target tokens in {target_seconds[item['id']]} s", flush=True)
        if args.outputs_cache:
            args.outputs_cache.write_text(json.dumps(cache))

    if args.drafter == "ngram":
        config = NgramConfig(min_match=args.min_match, max_match=args.max_match, max_drafts=max(args.k))
        drafter: Drafter = NgramDrafter(config)
        drafter_info = {"kind": "ngram", **asdict(config)}
    elif args.drafter == "mtp":
        capacity = max(len(prompts[i]) + len(outputs[i]) for i in prompts) + max(args.k) + 1
        target = target or load_model(checkpoint, target="cpu")
        drafter = mtp_drafter(target, capacity)
        drafter_info = {"kind": "mtp", "mtp_layers": target.mtp_layers, "greedy": True}
    else:
        capacity = max(len(prompts[i]) + len(outputs[i]) for i in prompts) + max(args.k) + 1
        drafter = GreedyModelDrafter(
            load_model(resolve_model(args.draft_model, progress=False), target="cpu"), capacity
        )
        drafter_info = {"kind": "draft", "model": args.draft_model, "greedy": True}

    results = []
    for k in args.k:
        total, per_prompt = AcceptanceStats(), {}
        for item in items:
            stats = replay(drafter, item["id"], prompts[item["id"]], outputs[item["id"]], k)
            total.merge(stats)
            per_prompt[item["id"]] = stats.to_dict()
        print(f"k={k}: {json.dumps({n: v for n, v in total.to_dict().items() if n.startswith('mean')})}", flush=True)
        results.append({"k": k, "total": total.to_dict(), "per_prompt": per_prompt})

    report = {
        "what": "greedy speculative decoding replayed over the target's own greedy output (tools/dev/spec_acceptance.py)",
        "commit": commit_of_repo(),
        "device": "cpu",
        "target": {"model": args.model, "file": target_path.name},
        "drafter": drafter_info,
        "workload": args.workload,
        "max_tokens": args.max_tokens,
        "prompts": [item["id"] for item in items],
        "target_greedy_seconds": target_seconds,
        "results": results,
        "outputs": {i: {"prompt_tokens": len(prompts[i]), "output_ids": outputs[i]} for i in prompts},
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
