"""The benchmark suite's report: bench.json → bench.md (tables, tools/bench_markdown.py) and
decode_vs_concurrency.png (tools/bench_plot.py).

Also merges the JSON of several suite runs (a full suite is split over several device calls):
    python -m ember.tools.bench_report OUT_DIR piece1/bench.json piece2/bench.json ...
writes OUT_DIR/bench.json (merged), bench.md and the PNG (the PNG only where matplotlib is installed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .bench_markdown import markdown
from .bench_plot import plot

PLOT_NAME = "decode_vs_concurrency.png"


def attach_hf_ratios(result: dict) -> dict:
    """Per measured model: ember's aggregate decode at c = the HF batch size ÷ HF's decode tok/s on the same
    shape (entry["hf_comparison"])."""
    from .bench_models import SYNTHETIC_PREFIX, parse_synthetic

    for name, entry in result.get("models", {}).items():
        if not name.startswith(SYNTHETIC_PREFIX) or "concurrency" not in entry:
            continue
        hf = result.get("hf", {}).get(parse_synthetic(name)[0], {})
        ember = {r.get("concurrency"): r.get("decode_tokens_per_s") for r in entry["concurrency"].get("runs", [])}
        comparison = {}
        for run in hf.get("runs", []):
            ours, theirs = ember.get(run.get("batch")), run.get("decode_tokens_per_s")
            if ours and theirs:
                comparison[f"batch_{run['batch']}"] = {
                    "ember_tokens_per_s": ours,
                    "hf_tokens_per_s": theirs,
                    "ratio": round(ours / theirs, 3),
                }
        if comparison:
            entry["hf_comparison"] = comparison
    return result


def merge(results: list[dict]) -> dict:
    """One result from several suite runs: later runs' sections replace earlier ones of the same model."""
    merged = {"suite": "ember bench --suite (merged)", "pieces": [], "models": {}, "hf": {}}
    for result in results:
        merged["pieces"].append(
            {
                key: result.get(key)
                for key in ("commit", "target", "started_at", "machine", "bandwidth", "sections", "wall_s", "config")
            }
        )
        for name, entry in result.get("models", {}).items():
            merged["models"].setdefault(name, {}).update(entry)
        merged["hf"].update(result.get("hf", {}))
    last = results[-1] if results else {}
    merged.update(
        commit=" + ".join(dict.fromkeys(str(r.get("commit")) for r in results)),
        target=last.get("target"),
        machine=last.get("machine"),
        bandwidth=last.get("bandwidth", {}),
        config=last.get("config", {}),
    )
    return attach_hf_ratios(merged)


def write_report(result: dict, out_dir) -> list[Path]:
    """bench.md and (with matplotlib) the PNG in out_dir; the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "bench.md"]
    written[0].write_text(markdown(result))
    if plot(result, out_dir / PLOT_NAME):
        written.append(out_dir / PLOT_NAME)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -m ember.tools.bench_report OUT_DIR bench.json [bench.json ...]", file=sys.stderr)
        return 2
    out_dir, pieces = Path(argv[0]), [json.loads(Path(p).read_text()) for p in argv[1:]]
    result = merge(pieces) if len(pieces) > 1 else attach_hf_ratios(pieces[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(result, indent=1))
    for path in [out_dir / "bench.json", *write_report(result, out_dir)]:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
