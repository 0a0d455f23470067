"""Shared by the fusion-pass tests: the specs every pass is checked on, and reading a compiled graph."""

from __future__ import annotations

SPECS = ["specs/qwen2.toml", "specs/llama.toml", "specs/qwen3.toml", "specs/gemma3.toml"]


def layer_ops(graph, region: str = "layer") -> list[str]:
    """The ops of a region's nodes, in order."""
    return [n.op for n in graph.region(region).nodes]
