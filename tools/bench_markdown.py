"""The benchmark suite's bench.md: per model, a table of its figures; then HF transformers' runs.

Each table row is one figure: its value, its fraction of the bandwidth roofline (decode figures), the
ratio to HF transformers on the same shape (batch 1 and 32, same workload: 256 → 256 tokens), the
issue's target for it where there is one (tools/bench_targets.py), and the peer figures the issue quotes.
"""

from __future__ import annotations

from .bench_targets import ISSUE_PEERS, ISSUE_TARGETS


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
