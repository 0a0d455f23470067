"""Choose the implementation of every node for the graph's target."""

from __future__ import annotations

from dataclasses import replace

from ..ir import Graph
from ..targets import Target

VARIANTS = ("default", "deterministic")


def select_kernels(graph: Graph, target: Target, variant: str = "default") -> Graph:
    """variant "deterministic" picks batch-invariant kernels where the target has them."""
    regions = []
    for region in graph.regions:
        nodes = tuple(replace(node, kernel=target.kernel_for(node, graph, variant)) for node in region.nodes)
        regions.append(replace(region, nodes=nodes))
    return replace(graph, regions=tuple(regions), target=target.name)
