"""Batch-1 decode speed with and without speculation, through the engine, on the real default model (CPU).

For each prompt of a workload (tools/dev/spec_workloads/*.json, rendered as one chat user message) one plain
engine and one speculating engine (same model, same process) decode it greedily; the order alternates per
prompt so drift in the machine's load hits both alike. Reported per prompt and in total: generated tokens,
decode seconds (first token to last, Usage.decode_s), decode tok/s, the speedup, the acceptance counts, and
whether the two outputs are identical (greedy speculation must not change a token). The load average is
recorded before and after: the machine is shared, so compare the ratio, measured in the same run. Every engine
compiles its step shapes first (Engine.precompile); a draft model's own drafting calls compile on first use.
--never-draft holds every draft back (the measured gate closed): the speculating engine's cost when idle.

    .venv/bin/python tools/dev/spec_engine_speed.py --workload code_editing --limit 4 --max-tokens 64 \\
        --speculative ngram --out docs/results/cpu_spec_engine_ngram_<commit>.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from ember.runtime.engine.engine import Engine, EngineConfig
from ember.runtime.loading.known_models import DEFAULT_MODEL, resolve_model
from ember.runtime.loading.model import load_model
from ember.runtime.loading.text.prompting import end_of_generation_ids, load_tokenizer, render_chat
from ember.runtime.sampling.params import SamplingParams
from ember.runtime.speculative.config import speculative_config
from ember.runtime.speculative.measured_gate import MeasuredGate
from ember.tools.dev.spec_acceptance import load_workload, user_message


def _engine(model, tokenizer, eos, context: int, speculative) -> Engine:
    config = EngineConfig(
        num_blocks=context // 16 + 4,
        max_model_len=context,
        max_num_seqs=1,
        max_batched_tokens=512,
        speculative=speculative,
    )
    return Engine(model, tokenizer, config, stop_token_ids=eos)


def _decode(engine: Engine, prompt_ids: list[int], max_tokens: int) -> dict:
    before = engine.speculation_stats()
    outputs = list(engine.submit(prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens)))
    usage = outputs[-1].usage
    after = engine.speculation_stats()
    tokens = [t for o in outputs for t in o.token_ids]
    decoded = max(usage.completion_tokens - 1, 0)  # the first token comes with the prefill
    return {
        "tokens": tokens,
        "completion_tokens": usage.completion_tokens,
        "decode_s": round(usage.decode_s, 3),
        "decode_tok_s": round(decoded / usage.decode_s, 3) if usage.decode_s > 0 else None,
        "drafts": after.num_drafts - before.num_drafts,
        "draft_tokens": after.num_draft_tokens - before.num_draft_tokens,
        "accepted_tokens": after.num_accepted_tokens - before.num_accepted_tokens,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--workload", nargs="+", default=["code_editing"])
    parser.add_argument("--limit", type=int, default=4, help="prompts per workload")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--speculative", nargs="+", default=["ngram"], choices=("ngram", "draft"))
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="timed decodes of each prompt per engine")
    parser.add_argument(
        "--never-draft",
        action="store_true",
        help="the measured gate never lets drafts through: what a speculating engine costs when it does not draft",
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.never_draft:
        MeasuredGate._decide = lambda self, planned: False

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    model = load_model(resolve_model(args.model))
    tokenizer = load_tokenizer(model.checkpoint)
    eos = end_of_generation_ids(tokenizer, model.checkpoint.generation_config)
    prompts = [
        (
            workload,
            item["id"],
            tokenizer.encode(
                render_chat(tokenizer, [{"role": "user", "content": user_message(item)}]), add_special_tokens=False
            ),
        )
        for workload in args.workload
        for item in load_workload(workload)[: args.limit]
    ]
    context = max(len(p) for _, _, p in prompts) + args.max_tokens + 16
    specs = {m: speculative_config(m, None, args.num_speculative_tokens, args.model) for m in args.speculative}
    engines = {"plain": _engine(model, tokenizer, eos, context, None)}
    engines.update({m: _engine(model, tokenizer, eos, context, spec) for m, spec in specs.items()})
    load_before = os.getloadavg()
    try:
        for engine in engines.values():  # compile every step shape before anything is timed (a draft model's own
            engine.precompile()  # drafting calls still compile on their first use)
            _decode(engine, prompts[0][2], 8)
        rows = []
        for i, (workload, prompt_id, ids) in enumerate(prompts * args.repeat):
            order = list(engines) if i % 2 == 0 else list(engines)[::-1]  # alternate: drift hits all alike
            runs = {name: _decode(engines[name], ids, args.max_tokens) for name in order}
            plain = runs.pop("plain")
            tokens = plain.pop("tokens")
            row = {"workload": workload, "id": prompt_id, "prompt_tokens": len(ids), "plain": plain}
            for name, run in runs.items():
                run["identical_output"] = run.pop("tokens") == tokens
                run["speedup"] = round(run["decode_tok_s"] / plain["decode_tok_s"], 3)
                row[name] = run
            rows.append(row)
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    totals = {}
    for workload in args.workload:
        mine = [r for r in rows if r["workload"] == workload]
        for name in engines:
            decoded = sum(r[name]["completion_tokens"] - 1 for r in mine)
            seconds = sum(r[name]["decode_s"] for r in mine)
            drafted = sum(r[name].get("drafts", 0) for r in mine)
            accepted = sum(r[name].get("accepted_tokens", 0) for r in mine)
            totals[f"{workload}/{name}"] = {
                "decoded_tokens": decoded,
                "decode_s": round(seconds, 2),
                "decode_tok_s": round(decoded / seconds, 3),
                "mean_acceptance_length": round(1 + accepted / drafted, 3) if drafted else None,
                "speedup": round(
                    decoded
                    / seconds
                    / (
                        sum(r["plain"]["completion_tokens"] - 1 for r in mine)
                        / sum(r["plain"]["decode_s"] for r in mine)
                    ),
                    3,
                ),
            }
    result = {
        "what": "batch-1 greedy decode tok/s through the engine, plain vs speculative, same process, alternating order",
        "commit": commit,  # the code measured: HEAD when the run started
        "model": args.model,
        "workloads": args.workload,
        "speculative": {m: vars(spec) for m, spec in specs.items()},
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "never_draft": args.never_draft,
        "machine": f"{os.cpu_count()} CPU cores, shared with other jobs",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prompts": rows,
        "totals": totals,
        "all_outputs_identical": all(r[m]["identical_output"] for r in rows for m in specs),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("totals", "all_outputs_identical")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
