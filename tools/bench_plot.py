"""The benchmark suite's PNG: aggregate decode tok/s against concurrency (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path

from .bench_targets import ISSUE_TARGETS


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
