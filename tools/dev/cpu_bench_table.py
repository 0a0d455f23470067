"""One JSON + markdown table from a tools/dev/bench_cpu_llamacpp.sh `compare` folder: Ember's `ember bench` figures
beside llama.cpp's on the same GGUF, measured back to back on this machine, with their ratios.

  .venv/bin/python -m ember.tools.dev.cpu_bench_table OUT_DIR --note "what else ran" > docs/results/cpu_bench.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .llamacpp_bench import parse_batched, parse_bench

FIGURES = (
    ("decode_1", "batch-1 decode tok/s"),
    ("prefill_128", "prefill 128 tok/s"),
    ("prefill_1024", "prefill 1,024 tok/s"),
    ("aggregate_4", "aggregate decode, 4 requests, tok/s"),
    ("aggregate_16", "aggregate decode, 16 requests, tok/s"),
)


def ember_figures(bench: dict, bench_1024: dict | None) -> dict:
    runs = {run["concurrency"]: run for run in bench["runs"]}
    figures = {
        "decode_1": runs[1]["decode_tokens_per_s"],
        "prefill_128": round(bench["prompt_tokens"] / runs[1]["ttft_p50_s"], 1),
        "aggregate_4": runs.get(4, {}).get("decode_tokens_per_s"),
        "aggregate_16": runs.get(16, {}).get("decode_tokens_per_s"),
        "load_s": bench["load_s"],
        "precompile_s": bench["precompile_s"],
    }
    if bench_1024:
        figures["prefill_1024"] = round(bench_1024["prompt_tokens"] / bench_1024["runs"][0]["ttft_p50_s"], 1)
    return figures


def llamacpp_figures(bench: list[dict], batched: list[dict]) -> dict:
    figures = {}
    for row in bench:
        key = "decode_1" if row["kind"] == "decode" else f"prefill_{row['tokens']}"
        figures[key] = row["tok_s"]
    for row in batched:
        if row["streams"] in (4, 16):
            figures[f"aggregate_{row['streams']}"] = row["decode_tok_s"]
    return figures


def collect(folder: Path) -> dict:
    models = {}
    for path in sorted(folder.glob("*.ember.json")):
        name = path.name.removesuffix(".ember.json")
        bench = json.loads(path.read_text())
        wide = folder / f"{name}.ember1024.json"
        ember = ember_figures(bench, json.loads(wide.read_text()) if wide.exists() and wide.stat().st_size else None)
        entry = {"ember": ember, "commit": bench["commit"], "precision": bench.get("precision", "fast")}
        ll_bench, ll_batched = folder / f"{name}.bench.json", folder / f"{name}.batched.jsonl"
        if ll_bench.exists() and ll_bench.stat().st_size:
            llama = llamacpp_figures(
                parse_bench(ll_bench.read_text()),
                parse_batched(ll_batched.read_text()) if ll_batched.exists() else [],
            )
            entry["llamacpp"] = llama
            entry["ratio"] = {
                key: round(ember[key] / llama[key], 2) for key, _ in FIGURES if ember.get(key) and llama.get(key)
            }
        models[name] = entry
    return models


def markdown(models: dict, note: str) -> str:
    lines = ["| model | figure | Ember | llama.cpp | Ember / llama.cpp |", "|---|---|---|---|---|"]
    for name, entry in models.items():
        llama, ratio = entry.get("llamacpp", {}), entry.get("ratio", {})
        for key, label in FIGURES:
            lines.append(
                f"| {name} | {label} | {entry['ember'].get(key, '—')} | {llama.get(key, '—')} | {ratio.get(key, '—')} |"
            )
        lines.append(
            f"| {name} | load / precompile s | {entry['ember']['load_s']} / {entry['ember']['precompile_s']} | | |"
        )
    return "\n".join(lines + ["", note])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    models = collect(args.folder)
    if args.json:
        args.json.write_text(json.dumps({"note": args.note, "models": models}, indent=1) + "\n")
    sys.stdout.write(markdown(models, args.note) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
