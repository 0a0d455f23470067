"""The benchmark suite's report: bench.json → bench.md (tables) and decode_vs_concurrency.png.

Also merges the JSON of several suite runs (a full suite is split over several device calls):
    python -m ember.tools.bench_report OUT_DIR piece1/bench.json piece2/bench.json ...
writes OUT_DIR/bench.json (merged), bench.md and the PNG (the PNG only where matplotlib is installed).

Each table row is one figure: its value, its fraction of the bandwidth roofline (decode figures), the
ratio to HF transformers on the same shape (batch 1 and 32, same workload: 256 → 256 tokens), the
issue's target for it where there is one, and the peer figures the issue quotes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The issue's targets (figure, where, comparison, value). "decode" rows apply to batch-1 decode (the
# smallest context, and the 1-request concurrency run); "roofline" to the batch-1 decode roofline fraction.
ISSUE_TARGETS = {
    "synthetic:qwen2.5-1.5b-q4_k_m": [
        ("decode", 1, ">=", 1200),
        ("aggregate", 32, ">=", 9000),
        ("aggregate", 128, ">=", 15000),
    ],
    "synthetic:llama3-8b": [
        ("decode", 1, ">=", 250),
        ("aggregate", 8, ">=", 1200),
        ("aggregate", 32, ">=", 4800),
        ("aggregate", 128, ">=", 12000),
        ("aggregate", 256, ">=", 14000),
        ("prefill", 4096, ">=", 32000),
        ("warm_start", None, "<=", 60),
    ],
    "synthetic:llama3-8b-q4_k_m": [
        ("decode", 1, ">=", 420),
        ("aggregate", 32, ">=", 4900),
        ("aggregate", 128, ">=", 9000),
        ("prefill", 4096, ">=", 20000),
        ("warm_start", None, "<=", 60),
    ],
    "synthetic:llama3-8b-fp8": [("roofline", 1, ">=", 0.85)],
}
# Peer figures as issue 5 quotes them (measured by the issue's author on the same H200, random weights, same
# layouts; llama.cpp with -fa 1; HF transformers bf16, static cache + torch.compile) — not measured by this tool.
_L15, _L8, _L8Q = "synthetic:qwen2.5-1.5b-q4_k_m", "synthetic:llama3-8b", "synthetic:llama3-8b-q4_k_m"
ISSUE_PEERS = {
    (_L15, "decode", 1): {"llama.cpp": 566, "HF (bf16)": 281},
    (_L15, "aggregate", 32): {"llama.cpp": 5972, "HF (bf16)": 1536},
    (_L15, "aggregate", 128): {"llama.cpp": 9902},
    (_L8, "decode", 1): {"llama.cpp": 209, "HF": 127},
    (_L8, "aggregate", 8): {"llama.cpp": 1062},
    (_L8, "aggregate", 32): {"llama.cpp": 4393, "HF": 1067},
    (_L8, "aggregate", 128): {"llama.cpp": 10443},
    (_L8, "prefill", 4096): {"llama.cpp": 28554},
    (_L8Q, "decode", 1): {"llama.cpp": 278},
    (_L8Q, "aggregate", 32): {"llama.cpp": 3245},
    (_L8Q, "aggregate", 128): {"llama.cpp": 5156},
    (_L8Q, "prefill", 4096): {"llama.cpp": 9853},
}
PLOT_NAME = "decode_vs_concurrency.png"


# ---- JSON -----------------------------------------------------------------------------------------------


def attach_hf_ratios(result: dict) -> dict:
    """Per measured model: ember's aggregate decode at c = the HF batch size ÷ HF's decode tok/s on the same
    shape (entry["hf_comparison"])."""
    from .bench import SYNTHETIC_PREFIX, parse_synthetic

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


# ---- markdown -------------------------------------------------------------------------------------------


def _num(value, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and abs(value) < 10:
        return f"{value:.{max(digits, 2)}f}"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def _bandwidths(bandwidth: dict) -> str:
    """ "copy [a, b], read [c, d] GB/s" (runs before 2026-12 measured the copy only)."""
    return ", ".join(f"{key[:-5]} {bandwidth[key]}" for key in ("copy_gb_s", "read_gb_s") if key in bandwidth) + " GB/s"


def _label(figure: str, at) -> str:
    return {
        "decode": "decode batch 1",
        "roofline": "decode batch 1, roofline fraction",
        "aggregate": f"aggregate decode, {at} concurrent",
        "prefill": f"prefill {at:,} tokens" if at else "prefill",
        "warm_start": "warm start (cache filled)",
    }.get(figure, figure)


def _target_cells(name: str, figure: str, at, value) -> tuple[str, str]:
    for fig, where, op, goal in ISSUE_TARGETS.get(name, []):
        if fig == figure and where == at:
            met = "—" if value is None else ("yes" if (value >= goal if op == ">=" else value <= goal) else "no")
            return f"{op} {_num(goal, 0) if goal >= 1 else goal}", met
    return "", ""


def _peers(name: str, figure: str, at) -> str:
    return ", ".join(f"{who} {_num(v, 0)}" for who, v in ISSUE_PEERS.get((name, figure, at), {}).items())


def _error(section: dict) -> str:
    return "error: " + str(section["error"]).replace("|", "/").replace("\n", " ")[:120]


def _model_rows(name: str, entry: dict) -> list[list[str]]:
    """One row per figure: label, value, roofline fraction, vs HF, issue target, met, issue's peers. `key`
    (figure, at) names the issue target a row is held to: batch-1 decode targets hold for the smallest
    context and for the 1-request run; aggregate ones for their concurrency."""
    rows = []

    def row(label, shown, fraction=None, hf="", key=None, value=None):
        target, met = _target_cells(name, *key, value) if key else ("", "")
        rows.append(
            [
                label,
                shown,
                _num(fraction, 3) if fraction is not None else "",
                hf,
                target,
                met,
                _peers(name, *key) if key else "",
            ]
        )

    context = entry.get("context", {}).get("runs", [])
    smallest = min((r["context"] for r in context), default=None)
    for r in context:
        label = f"decode batch 1, context {r['context']:,}"
        if "error" in r:
            row(label, _error(r))
            continue
        rate = r.get("decode_tokens_per_s")
        row(
            label,
            f"{_num(rate)} tok/s",
            r.get("roofline_fraction"),
            key=("decode", 1) if r["context"] == smallest else None,
            value=rate,
        )
        if r["context"] == smallest and any(t[0] == "roofline" for t in ISSUE_TARGETS.get(name, [])):
            row(
                _label("roofline", 1),
                _num(r.get("roofline_fraction"), 3),
                key=("roofline", 1),
                value=r.get("roofline_fraction"),
            )
    for r in entry.get("prefill", {}).get("runs", []):
        at = r["prompt_tokens"]
        row(
            _label("prefill", at),
            _error(r) if "error" in r else f"{_num(r['prefill_tokens_per_s'], 0)} tok/s (TTFT {r['ttft_s']:.3f} s)",
            key=("prefill", at),
            value=r.get("prefill_tokens_per_s"),
        )
    comparison = entry.get("hf_comparison", {})
    for r in entry.get("concurrency", {}).get("runs", []):
        c = r["concurrency"]
        hf = comparison.get(f"batch_{c}")
        rate = r.get("decode_tokens_per_s")
        row(
            _label("aggregate", c),
            _error(r) if "error" in r else f"{_num(rate)} tok/s",
            r.get("roofline_fraction"),
            f"{hf['ratio']:.2f}× (HF {_num(hf['hf_tokens_per_s'])})" if hf else "",
            key=("decode", 1) if c == 1 else ("aggregate", c),
            value=rate,
        )
    ttft = entry.get("ttft")
    if ttft:
        row(
            f"TTFT p50 / p99, {ttft.get('concurrency', '?')} concurrent",
            _error(ttft) if "error" in ttft else f"{ttft['ttft_p50_s']} s / {ttft['ttft_p99_s']} s",
        )
    startup = entry.get("startup")
    if startup:
        cold, warm = startup.get("cold", startup), startup.get("warm", startup)  # a section error: both show it
        row(
            "cold compile (empty cache)",
            _error(cold)
            if "error" in cold
            else f"{cold.get('precompile_s')} s for {cold.get('shapes')} step shapes, {cold.get('executables')} "
            f"executables (load {cold.get('load_s')} s)",
        )
        row(
            _label("warm_start", None),
            _error(warm)
            if "error" in warm
            else f"{warm.get('wall_s')} s (process start to ready; load {warm.get('load_s')} s, "
            f"plans {warm.get('precompile_s')} s)",
            key=("warm_start", None),
            value=warm.get("wall_s"),
        )
    return rows


def markdown(result: dict) -> str:
    bandwidth = result.get("bandwidth", {})
    machine = result.get("machine") or {}
    lines = [
        f"# Ember benchmark suite — target `{result.get('target')}`",
        "",
        f"Commit {result.get('commit')}; {machine.get('device', '?')} ({machine.get('platform', '?')}), "
        f"JAX {machine.get('jax', '?')}"
        + ("." if result.get("pieces") else f"; started {result.get('started_at')}; wall {result.get('wall_s')} s."),
        f"HBM bandwidth measured in this run: {_bandwidths(bandwidth)} (rooflines use the highest)."
        if not result.get("pieces")
        else "HBM bandwidth per run: "
        + "; ".join(_bandwidths(p.get("bandwidth") or {}) for p in result["pieces"])
        + " (each run's "
        "rooflines use its highest).",
        "Decode tok/s come from the engine's step completion times; roofline fraction = measured ÷ (bandwidth ÷ "
        "bytes read per step: device weight bytes without gathered-only embeddings + KV at that context). "
        "HF = transformers on the same shape in bf16 (static cache + torch.compile), same workload; "
        "peer figures are the issue's numbers, not measured here.",
        "",
    ]
    if result.get("pieces"):
        lines += [
            f"Merged from {len(result['pieces'])} runs: "
            + "; ".join(f"{p.get('started_at')} ({', '.join(p.get('sections') or [])})" for p in result["pieces"])
            + ".",
            "",
        ]
    header = ["figure", "value", "roofline fraction", "vs HF (ember/HF)", "issue target", "met", "issue's peers"]
    for name, entry in result.get("models", {}).items():
        lines += [f"## {name}", ""]
        if "error" in entry:
            lines += [f"{_error(entry)}", ""]
        if "weight_bytes_per_step" in entry:
            lines += [
                f"{entry.get('arch')} from a {entry.get('checkpoint_format')} checkpoint; "
                f"{entry['weight_bytes_per_step'] / 1e9:.2f} GB of weights read per decode step "
                f"(device weights by dtype: {_bytes_by_dtype(entry.get('weight_bytes_by_dtype', {}))}); "
                f"KV {entry.get('kv_dtype')}; loaded in {entry.get('load_s')} s.",
                "",
            ]
        lines += _engine_lines(entry)
        rows = _model_rows(name, entry)
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    for shape, hf in result.get("hf", {}).items():
        lines += [
            f"HF transformers, {shape}: "
            + (
                _error(hf)
                if "error" in hf
                else ", ".join(
                    f"batch {r.get('batch')}: "
                    + (
                        _error(r)
                        if "error" in r
                        else f"{_num(r.get('decode_tokens_per_s'))} tok/s"
                        + (f" ({r['roofline_fraction']:.3f} of roofline)" if r.get("roofline_fraction") else "")
                    )
                    for r in hf.get("runs", [])
                )
                + f" (torch {hf.get('torch')}, transformers {hf.get('transformers')}, compile {hf.get('compile')})"
            ),
            "",
        ]
    return "\n".join(lines)


def _engine_lines(entry: dict) -> list[str]:
    """What the engines measured were: the batch-1 engine (context, prefill) and the concurrency engine."""
    parts = []
    for section, what in (("context", "batch-1 engine"), ("concurrency", "concurrency engine")):
        e = (entry.get(section) or {}).get("engine")
        if e:
            parts.append(
                f"{what}: max_model_len {e['max_model_len']:,}, max_num_seqs {e['max_num_seqs']}, "
                f"max_batched_tokens {e['max_batched_tokens']:,}, {e['num_blocks']:,} KV blocks"
            )
    return ["; ".join(parts) + ".", ""] if parts else []


def _bytes_by_dtype(by_dtype: dict) -> str:
    return ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in by_dtype.items()) or "?"


# ---- plot -----------------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> bool:
    """Aggregate decode tok/s vs concurrency: one line per model, the issue's targets as open triangles in
    its colour, HF transformers (per shape) as crosses. False (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name, entry in result.get("models", {}).items():
        runs = [r for r in entry.get("concurrency", {}).get("runs", []) if r.get("decode_tokens_per_s")]
        if not runs:
            continue
        (line,) = ax.plot(
            [r["concurrency"] for r in runs],
            [r["decode_tokens_per_s"] for r in runs],
            marker="o",
            label=name.removeprefix("synthetic:"),
        )
        targets = [
            (1 if fig == "decode" else at, goal)
            for fig, at, _, goal in ISSUE_TARGETS.get(name, [])
            if fig in ("decode", "aggregate")
        ]
        if targets:
            ax.scatter(
                *zip(*targets),
                marker="^",
                facecolors="none",
                edgecolors=line.get_color(),
                label=f"issue target, {line.get_label()}",
            )
    for (shape, hf), marker in zip(result.get("hf", {}).items(), "x+*1234"):
        points = [(r["batch"], r["decode_tokens_per_s"]) for r in hf.get("runs", []) if r.get("decode_tokens_per_s")]
        if points:
            ax.scatter(*zip(*points), marker=marker, s=70, color="black", label=f"HF transformers bf16, {shape}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xlabel("concurrent requests (256 → 256 tokens each)")
    ax.set_ylabel("aggregate decode tok/s")
    ax.set_title(f"Ember decode throughput, target {result.get('target')}, commit {result.get('commit')}")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


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
