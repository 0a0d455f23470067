"""Shared by the fusion-pass tests: the specs every pass is checked on, and reading a compiled graph."""

from __future__ import annotations

SPECS = ["specs/qwen2.toml", "specs/llama.toml", "specs/qwen3.toml", "specs/gemma3.toml"]


def layer_ops(graph, region: str = "layer") -> list[str]:
    """The ops of a region's nodes, in order."""
    return [n.op for n in graph.region(region).nodes]


def read_elsewhere(graph, value: str, region: str = "layer"):
    """graph with one more node in `region` reading `value` (twice, as an add): the read a fusion pass must
    see before it folds that value into its only other reader."""
    from dataclasses import replace

    from ember.compiler.ir import Node

    nodes = graph.region(region).nodes
    return graph.with_region(replace(graph.region(region), nodes=nodes + (Node("add", (value, value), ("spy",)),)))
