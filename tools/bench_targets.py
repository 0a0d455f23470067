"""The issue's targets and peer figures that the benchmark suite's report holds each measurement to
(tools/bench_markdown.py's tables, tools/bench_plot.py's PNG)."""

from __future__ import annotations

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
# Peer figures as the h200 target's issue quotes them (measured by the issue's author on the same H200, random weights, same
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
