"""Shared by the fusion-pass tests: the specs every pass is checked on, and reading a compiled graph."""

from __future__ import annotations

SPECS = ["specs/qwen2.toml", "specs/llama.toml", "specs/qwen3.toml", "specs/gemma3.toml"]


def layer_ops(graph, region: str = "layer") -> list[str]:
    """The ops of a region's nodes, in order."""
    return [n.op for n in graph.region(region).nodes]


def compile_without(spec, target: str, *skipped: str, variant: str = "default"):
    """compile_graph(spec, target) with the named phases left out: what the other passes make, for a test of
    a pass whose output a later one folds further (e.g. fuse_norm_into_gemv takes gated_mlp nodes in)."""
    from ember.compiler.frontend import lower
    from ember.compiler.pipeline import phases
    from ember.compiler.targets import get_target

    graph = lower(spec)
    for name, run in phases(get_target(target), variant):
        if name not in skipped:
            graph = run(graph)
    return graph
